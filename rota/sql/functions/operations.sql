-- Operations (rota/core/admin.py): what an operator does to tasks, queues
-- and tenants, each recorded in rota.audit.

-- Cancels tasks. A waiting one (ready or scheduled) is cancelled at once; a
-- running one when its attempt ends (it is not retried; a success still
-- counts); an ended one not at all. The scheduled rows are taken first, then
-- the ready ones in a statement of their own: a promotion in flight is
-- waited for, and the task it put in line is then taken from there. Returns
-- each known id with 'cancelled', 'cancelling' (running) or its end state.
CREATE OR REPLACE FUNCTION rota.cancel(p_ids uuid[], p_actor text)
RETURNS TABLE (id uuid, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now uuid[];
BEGIN
    WITH unscheduled AS (
        DELETE FROM rota.scheduled s WHERE s.task_id = ANY (p_ids) RETURNING s.task_id
    )
    SELECT coalesce(array_agg(task_id), '{}') INTO v_now FROM unscheduled;
    WITH unready AS (
        DELETE FROM rota.ready r WHERE r.task_id = ANY (p_ids) RETURNING r.task_id
    ), unparked AS (
        -- Their keys' parked counts are put right by rota.unpark.
        DELETE FROM rota.parked p WHERE p.task_id = ANY (p_ids) RETURNING p.task_id
    )
    SELECT v_now || coalesce(array_agg(task_id), '{}') INTO v_now
    FROM (SELECT task_id FROM unready UNION ALL SELECT task_id FROM unparked) u;
    -- Joins waiting for their members (scheduled, with no schedule yet).
    v_now := v_now || ARRAY(
        SELECT t.id FROM rota.tasks t JOIN rota.joins j ON j.task_id = t.id
        WHERE t.id = ANY (p_ids) AND t.status = 'scheduled' AND NOT t.id = ANY (v_now));
    UPDATE rota.tasks t
    SET status = 'cancelled', cancel_requested = true, finished_at = now(),
        last_error = 'cancelled by ' || p_actor
    WHERE t.id = ANY (v_now);
    -- Claimed: it ends with its attempt, and the worker holding it is told
    -- (rota_cancel: "worker task"), to stop it now.
    UPDATE rota.tasks t SET cancel_requested = true
    WHERE t.id = ANY (p_ids) AND t.status = 'pending' AND NOT t.id = ANY (v_now);
    PERFORM pg_notify('rota_cancel', r.worker || ' ' || r.task_id::text)
    FROM rota.running r WHERE r.task_id = ANY (p_ids);
    -- Their results' waiters learn it at once.
    PERFORM pg_notify('rota_results', c::text) FROM unnest(v_now) AS c;
    RETURN QUERY
    WITH outcomes AS (
        SELECT t.id,
               CASE WHEN t.id = ANY (v_now) THEN 'cancelled'
                    WHEN t.status = 'pending' THEN 'cancelling'
                    ELSE t.status::text END AS outcome
        FROM rota.tasks t WHERE t.id = ANY (p_ids)
        UNION ALL
        SELECT f.task_id, 'succeeded' FROM rota.finished f WHERE f.task_id = ANY (p_ids)
    ), logged AS (
        INSERT INTO rota.audit (actor, action, target, detail, count)
        SELECT p_actor, 'cancel', 'task', jsonb_build_object('ids', to_jsonb(p_ids)),
               count(*) FILTER (WHERE o.outcome IN ('cancelled', 'cancelling'))
        FROM outcomes o
    )
    SELECT o.id, o.outcome FROM outcomes o;
END
$$;

-- Runs dead or cancelled tasks again: same ids, a fresh attempt budget, a
-- fair place in line as soon as maintenance promotes them (within a second).
-- Returns the ids retried.
CREATE OR REPLACE FUNCTION rota.retry(p_ids uuid[], p_actor text, p_target text DEFAULT 'task')
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[];
BEGIN
    WITH revived AS (
        UPDATE rota.tasks t
        SET status = 'scheduled', attempts = 0, cancel_requested = false, finished_at = NULL,
            unknown_since = NULL
        WHERE t.id = ANY (p_ids) AND t.status IN ('dead', 'cancelled')
        RETURNING t.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO v_ids FROM revived;
    -- A join whose members have not all succeeded waits for them again.
    INSERT INTO rota.scheduled (run_at, task_id) SELECT now(), x FROM unnest(v_ids) x
    WHERE NOT EXISTS (SELECT FROM rota.joins j WHERE j.task_id = x AND NOT j.released);
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'retry', p_target, jsonb_build_object('ids', to_jsonb(v_ids)),
            cardinality(v_ids));
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

-- Pauses or resumes a queue, or a tenant in every queue (p_kind: 'queue' or
-- 'tenant'), and records it; false if there is no such one. A resume wakes
-- the workers of the queues it may free.
CREATE OR REPLACE FUNCTION rota.set_paused(p_kind text, p_name text, p_paused boolean,
                                           p_actor text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind = 'queue' THEN
        UPDATE rota.queues SET paused = p_paused WHERE name = p_name;
    ELSE
        UPDATE rota.tenants SET paused = p_paused WHERE name = p_name;
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_paused THEN 'pause' ELSE 'resume' END, p_kind || ':' || p_name, 1);
    IF NOT p_paused THEN
        PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
        WHERE p_kind = 'tenant' OR q.name = p_name;
    END IF;
    RETURN true;
END
$$;

-- Pauses or resumes a queue; false if there is no such queue.
CREATE OR REPLACE FUNCTION rota.pause_queue(p_name text, p_paused boolean, p_actor text)
RETURNS boolean
LANGUAGE sql AS $$ SELECT rota.set_paused('queue', p_name, p_paused, p_actor) $$;

-- Pauses or resumes a tenant in every queue; false if there is no such tenant.
CREATE OR REPLACE FUNCTION rota.pause_tenant(p_name text, p_paused boolean, p_actor text)
RETURNS boolean
LANGUAGE sql AS $$ SELECT rota.set_paused('tenant', p_name, p_paused, p_actor) $$;

-- Creates a tenant or changes the settings named in p_changes (weight,
-- concurrency_limit, rate_limit, rate_burst, capacity; a JSON null clears a
-- limit), keeping the others. Returns its slot.
CREATE OR REPLACE FUNCTION rota.patch_tenant(p_name text, p_changes jsonb, p_actor text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v rota.tenants;
    v_id integer;
BEGIN
    INSERT INTO rota.tenants (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO v FROM rota.tenants WHERE name = p_name FOR UPDATE;
    v_id := rota.configure_tenant(
        p_name,
        CASE WHEN p_changes ? 'weight' THEN (p_changes ->> 'weight')::float8 ELSE v.weight END,
        CASE WHEN p_changes ? 'concurrency_limit' THEN (p_changes ->> 'concurrency_limit')::integer
             ELSE v.concurrency_limit END,
        CASE WHEN p_changes ? 'rate_limit' THEN (p_changes ->> 'rate_limit')::float8
             ELSE v.rate_limit END,
        CASE WHEN p_changes ? 'rate_burst' THEN (p_changes ->> 'rate_burst')::float8
             WHEN p_changes ? 'rate_limit' THEN NULL
             ELSE v.rate_burst END,
        CASE WHEN p_changes ? 'capacity' THEN (p_changes ->> 'capacity')::bigint
             ELSE v.capacity END);
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'configure', 'tenant:' || p_name, p_changes, 1);
    RETURN v_id;
END
$$;

-- Charges a queue's tenants by measured run time (p_charge), or by declared
-- cost alone; false if there is no such queue.
CREATE OR REPLACE FUNCTION rota.charge_queue(p_name text, p_charge_time boolean, p_actor text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.queues SET charge_time = p_charge_time WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_charge_time THEN 'charge by time' ELSE 'charge by cost' END,
            'queue:' || p_name, 1);
    RETURN true;
END
$$;
