-- Operations: queues and tenants can be paused (the claim skips them),
-- tasks cancelled and retried, every action audited; failures keep their
-- whole traceback; service is counted per minute for the console.

ALTER TABLE rota.queues ADD COLUMN paused boolean NOT NULL DEFAULT false;

ALTER TABLE rota.tenants ADD COLUMN paused boolean NOT NULL DEFAULT false;
DROP INDEX rota.tenants_limited;
ALTER TABLE rota.tenants DROP COLUMN limited;
ALTER TABLE rota.tenants ADD COLUMN limited boolean GENERATED ALWAYS AS
    (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL OR paused) STORED;
CREATE INDEX tenants_limited ON rota.tenants (id) WHERE limited;

ALTER TABLE rota.tasks
    ADD COLUMN traceback text,
    ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;

-- Claims up to `limit` ready tasks of the given queues in fair order, in one
-- statement. Paused queues are not read; paused tenants, and tenants at their
-- concurrency limit or out of rate tokens, are skipped by the scan; the admission below is the race-proof check. Tenants
-- without limits (most) skip the admission's locking, counting and ranking.
-- SECURITY DEFINER: a worker's role claims through it, holding no direct
-- UPDATE or DELETE on the tables.
CREATE OR REPLACE FUNCTION rota.claim(p_queues text[], p_limit integer, p_worker text,
                           p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH limits AS MATERIALIZED (
        -- Every limited tenant (the partial index holds only those), and those
        -- that cannot take a task now.
        SELECT coalesce(array_agg(t.id), '{}') AS limited,
               coalesce(array_agg(t.id) FILTER (
                   WHERE t.paused
                      OR t.running >= t.concurrency_limit
                      OR t.rate_limit IS NOT NULL
                         AND least(t.rate_burst,
                                   t.tokens + t.rate_limit * extract(epoch FROM now() - t.refilled_at)) < 1),
                   '{}') AS blocked
        FROM rota.tenants t
        WHERE t.limited
    ), candidates AS MATERIALIZED (
        SELECT c.*, q.name AS queue
        FROM rota.queues q
        CROSS JOIN LATERAL (
            SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id
            FROM rota.ready r
            -- `+ 0` hides the column's statistics from this filter: when one
            -- tenant holds the whole backlog they make the planner expect no row
            -- to pass it, and it then sorts a seq scan of ready on every claim.
            WHERE r.queue_id = q.id AND r.tenant_id + 0 <> ALL ((SELECT blocked FROM limits)::integer[])
            ORDER BY r.vtime, r.tenant_id, r.seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) c
        WHERE q.name = ANY (p_queues) AND NOT q.paused
        ORDER BY c.vtime, c.tenant_id, c.seq
        LIMIT p_limit
    ), limited AS MATERIALIZED (
        -- The candidates' limited tenants, locked in id order, as every writer of
        -- tenant counters locks them; FOR UPDATE reads the latest committed
        -- counters, so racing claims cannot both take the last free slot.
        SELECT t.id,
               t.concurrency_limit - t.running AS free_slots,
               -- least() skips NULLs: without a rate limit the tokens must stay NULL.
               CASE WHEN t.rate_limit IS NOT NULL
                    THEN least(t.rate_burst,
                               t.tokens + t.rate_limit * extract(epoch FROM now() - t.refilled_at))
               END AS tokens
        FROM rota.tenants t
        WHERE t.limited AND t.id = ANY (ARRAY(
            SELECT DISTINCT c.tenant_id FROM candidates c
            WHERE c.tenant_id = ANY ((SELECT limited FROM limits)::integer[])))
        ORDER BY t.id
        FOR UPDATE
    ), admitted AS MATERIALIZED (
        -- Unlimited tenants' candidates as they are; a limited tenant's, in its
        -- order, as many as it has free slots and tokens.
        SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, false AS counted
        FROM candidates c
        WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
        UNION ALL
        SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id,
               l.free_slots IS NOT NULL
        FROM (
            SELECT candidates.*,
                   row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
            FROM candidates
            WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
        ) c
        JOIN limited l ON l.id = c.tenant_id
        WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))
    ), charged AS (
        UPDATE rota.tenants t
        SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
            tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
            refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
        FROM (SELECT tenant_id, count(*) AS n FROM admitted GROUP BY tenant_id) a
        JOIN limited l ON l.id = a.tenant_id
        -- The ANY keeps the planner on the key, even with a plan made on few tenants.
        WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))
    ), taken AS (
        DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM admitted))
    ), claimed AS MATERIALIZED (
        SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.counted,
               t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
               now() + make_interval(secs => p_lease_seconds) AS lease_expires_at
        FROM rota.tasks t
        JOIN admitted a ON a.task_id = t.id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM admitted))
    ), leased AS (
        INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                  lease_expires_at, counted)
        SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted
        FROM claimed
    )
    SELECT c.task_id AS id, c.name, c.payload::text, c.queue,
           -- Looked up only for tasks stored before the name was copied to them.
           coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
               AS tenant,
           c.attempt,
           c.max_attempts, c.lease_expires_at, c.enqueued_at
    FROM claimed c
    ORDER BY c.vtime, c.tenant_id, c.seq;
END
$$;


DROP FUNCTION rota.fail(uuid[], integer[], text[], timestamptz[], boolean[]);

-- Fails claimed tasks: each is retried after its backoff (exponential, with
-- jitter), or at p_retry_at when given (an explicit retry), until its last
-- attempt; then, or at once when p_final (an unknown task, say), it is dead,
-- with its last error and traceback kept. A task cancelled while it ran ends
-- as 'cancelled' instead. Stale tokens are refused.
CREATE FUNCTION rota.fail(
    p_ids uuid[], p_attempts integer[], p_errors text[], p_retry_at timestamptz[],
    p_final boolean[], p_tracebacks text[] DEFAULT NULL
) RETURNS TABLE (id uuid, status rota.task_status, run_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH failed AS MATERIALIZED (
        SELECT r.task_id, r.attempt, x.error, x.retry_at, x.final, x.traceback
        FROM rota.take_running(p_ids, p_attempts) r
        -- A NULL p_tracebacks unnests as NULLs beside the other arrays.
        JOIN unnest(p_ids, p_errors, p_retry_at, p_final, p_tracebacks)
             AS x(id, error, retry_at, final, traceback)
          ON x.id = r.task_id
    ), decided AS (
        SELECT f.task_id, f.attempt, f.error, f.traceback, t.cancel_requested,
               CASE WHEN f.final OR t.cancel_requested OR f.attempt >= t.max_attempts THEN NULL
                    ELSE coalesce(f.retry_at, now() + make_interval(secs =>
                        rota.backoff_seconds(f.attempt, t.backoff_base, t.backoff_max)))
               END AS run_at
        FROM failed f JOIN rota.tasks t ON t.id = f.task_id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM failed))
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT d.run_at, d.task_id FROM decided d WHERE d.run_at IS NOT NULL
    )
    UPDATE rota.tasks t
    SET status = CASE WHEN d.cancel_requested THEN 'cancelled'
                      WHEN d.run_at IS NULL THEN 'dead'
                      ELSE 'scheduled' END::rota.task_status,
        attempts = d.attempt, last_error = d.error, traceback = d.traceback,
        finished_at = CASE WHEN d.run_at IS NULL THEN now() END
    FROM decided d
    WHERE t.id = ANY (ARRAY(SELECT task_id FROM failed)) AND t.id = d.task_id
    RETURNING t.id, t.status, d.run_at;
END
$$;

-- Puts claimed tasks back in line at the place they had. p_consume says
-- whether the attempt counts: it does for an expired lease or a dead worker
-- (the task may have run), not for a task handed back unstarted at shutdown.
-- A task out of attempts is dead instead, and one cancelled while it ran is
-- cancelled. Returns the ids put back in line.
CREATE OR REPLACE FUNCTION rota.requeue(p_ids uuid[], p_attempts integer[], p_consume boolean, p_reason text)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows rota.running[];
BEGIN
    SELECT array_agg(r) INTO v_rows FROM rota.take_running(p_ids, p_attempts) r;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    IF p_consume THEN
        UPDATE rota.tasks t
        SET attempts = r.attempt, last_error = p_reason,
            status = CASE WHEN r.attempt >= t.max_attempts THEN 'dead' ELSE t.status END,
            finished_at = CASE WHEN r.attempt >= t.max_attempts THEN now() END
        FROM unnest(v_rows) r
        WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x)) AND t.id = r.task_id;
    END IF;
    UPDATE rota.tasks t SET status = 'cancelled', finished_at = now()
    WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x))
      AND t.cancel_requested AND t.status = 'pending';

    RETURN QUERY
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id)
    SELECT r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id
    FROM unnest(v_rows) r JOIN rota.tasks t ON t.id = r.task_id
    WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x)) AND t.status = 'pending'
    RETURNING task_id;

    PERFORM pg_notify('rota_ready', q.name)
    FROM rota.queues q WHERE q.id IN (SELECT r.queue_id FROM unnest(v_rows) r);
END
$$;

-- Drops up to p_limit dead or cancelled tasks that ended before p_older_than ago.
CREATE OR REPLACE FUNCTION rota.prune_dead(p_older_than interval, p_limit integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.tasks WHERE id = ANY (ARRAY(
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'dead' AND t.finished_at < now() - p_older_than
            UNION ALL
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'cancelled' AND t.finished_at < now() - p_older_than
            LIMIT p_limit))
        AND status IN ('dead', 'cancelled')
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Operations (rota/core/admin.py): every action is recorded here, with who
-- did it, to what, and to how many tasks.
CREATE TABLE rota.audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,  -- 'task', 'queue:NAME', 'tenant:NAME', 'dead', ...
    detail jsonb NOT NULL DEFAULT '{}',
    count bigint NOT NULL
);
CREATE INDEX audit_at ON rota.audit (at);
-- A task's actions, for its history.
CREATE INDEX audit_task_ids ON rota.audit USING gin ((detail -> 'ids'));

CREATE INDEX tasks_cancelled ON rota.tasks (finished_at) WHERE status = 'cancelled';

-- Cancels tasks. A waiting one (ready or scheduled) is cancelled at once; a
-- running one when its attempt ends (it is not retried; a success still
-- counts); an ended one not at all. The scheduled rows are taken first, then
-- the ready ones in a statement of their own: a promotion in flight is
-- waited for, and the task it put in line is then taken from there. Returns
-- each known id with 'cancelled', 'cancelling' (running) or its end state.
CREATE FUNCTION rota.cancel(p_ids uuid[], p_actor text)
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
    )
    SELECT v_now || coalesce(array_agg(task_id), '{}') INTO v_now FROM unready;
    UPDATE rota.tasks t
    SET status = 'cancelled', cancel_requested = true, finished_at = now(),
        last_error = 'cancelled by ' || p_actor
    WHERE t.id = ANY (v_now);
    -- Claimed: it ends with its attempt.
    UPDATE rota.tasks t SET cancel_requested = true
    WHERE t.id = ANY (p_ids) AND t.status = 'pending' AND NOT t.id = ANY (v_now);
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
CREATE FUNCTION rota.retry(p_ids uuid[], p_actor text, p_target text DEFAULT 'task')
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
    INSERT INTO rota.scheduled (run_at, task_id) SELECT now(), x FROM unnest(v_ids) x;
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'retry', p_target, jsonb_build_object('ids', to_jsonb(v_ids)),
            cardinality(v_ids));
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

-- Pauses or resumes a queue; false if there is no such queue.
CREATE FUNCTION rota.pause_queue(p_name text, p_paused boolean, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.queues SET paused = p_paused WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_paused THEN 'pause' ELSE 'resume' END, 'queue:' || p_name, 1);
    IF NOT p_paused THEN
        PERFORM pg_notify('rota_ready', p_name);
    END IF;
    RETURN true;
END
$$;

-- Pauses or resumes a tenant in every queue; false if there is no such tenant.
CREATE FUNCTION rota.pause_tenant(p_name text, p_paused boolean, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.tenants SET paused = p_paused WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_paused THEN 'pause' ELSE 'resume' END, 'tenant:' || p_name, 1);
    IF NOT p_paused THEN
        PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q;
    END IF;
    RETURN true;
END
$$;

-- Creates a tenant or changes the settings named in p_changes (weight,
-- concurrency_limit, rate_limit, rate_burst, capacity; a JSON null clears a
-- limit), keeping the others. Returns its slot.
CREATE FUNCTION rota.patch_tenant(p_name text, p_changes jsonb, p_actor text) RETURNS integer
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

-- Service per minute, queue and tenant, counted from rota.finished by a
-- maintenance duty (rota.count_service): what the console's throughput and
-- fair-share figures read, without touching the claim's path.
CREATE TABLE rota.service (
    minute timestamptz NOT NULL,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    completed integer NOT NULL,
    wait_seconds double precision NOT NULL,  -- summed enqueue -> start waits
    PRIMARY KEY (minute, queue_id, tenant_id)
);
CREATE TABLE rota.service_counted (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    up_to timestamptz NOT NULL
);

-- Counts what finished since the last count, up to a second ago (a
-- completion's row carries its transaction's start time, and commits
-- shortly after); keeps a day. Returns the completions counted.
CREATE FUNCTION rota.count_service() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_from timestamptz;
    v_to timestamptz := now() - interval '1 second';
    v_counted bigint;
BEGIN
    SELECT up_to INTO v_from FROM rota.service_counted FOR UPDATE;
    IF v_from IS NULL THEN
        v_from := v_to - interval '1 hour';
        INSERT INTO rota.service_counted (up_to) VALUES (v_from);
    END IF;
    IF v_to <= v_from THEN
        RETURN 0;
    END IF;
    WITH counts AS MATERIALIZED (
        SELECT date_trunc('minute', f.finished_at) AS minute, f.queue_id, f.tenant_id,
               count(*) AS completed,
               sum(greatest(0, extract(epoch FROM f.started_at - f.enqueued_at))) AS waits
        FROM rota.finished f
        WHERE f.finished_at > v_from AND f.finished_at <= v_to
        GROUP BY 1, 2, 3
    ), saved AS (
        INSERT INTO rota.service AS s (minute, queue_id, tenant_id, completed, wait_seconds)
        SELECT minute, queue_id, tenant_id, completed, waits FROM counts
        ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE
        SET completed = s.completed + excluded.completed,
            wait_seconds = s.wait_seconds + excluded.wait_seconds
    )
    SELECT coalesce(sum(completed), 0) INTO v_counted FROM counts;
    UPDATE rota.service_counted SET up_to = v_to;
    DELETE FROM rota.service WHERE minute < now() - interval '1 day';
    RETURN v_counted;
END
$$;

-- The figures the console shows, per queue and tenant, refreshed by a
-- maintenance duty (rota.refresh_stats) rather than counted on every page
-- view: however many consoles are open, the queue tables are read once per
-- interval. `at` says how fresh they are.
CREATE TABLE rota.stats (
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    waiting bigint NOT NULL,
    running bigint NOT NULL,
    scheduled bigint NOT NULL,
    dead bigint NOT NULL,
    -- When the tenant's first task in line in this queue was enqueued.
    oldest_enqueued_at timestamptz,
    at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, tenant_id)
);

-- Recounts rota.stats from the queue tables; returns the rows written.
CREATE FUNCTION rota.refresh_stats() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
BEGIN
    -- One refresh at a time; a second caller leaves it to the first.
    IF NOT pg_try_advisory_xact_lock(hashtext('rota.refresh_stats')) THEN
        RETURN 0;
    END IF;
    DELETE FROM rota.stats;
    WITH counts (queue_id, tenant_id, waiting, running, scheduled, dead, first_vtime) AS (
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, min(vtime)
        FROM rota.ready GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, count(*), 0, 0, NULL FROM rota.running GROUP BY 1, 2
        UNION ALL
        SELECT t.queue_id, t.tenant_id, 0, 0, count(*), 0, NULL
        FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, 0, 0, count(*), NULL
        FROM rota.tasks WHERE status = 'dead' GROUP BY 1, 2
    ), grouped AS (
        SELECT queue_id, tenant_id, sum(waiting) AS waiting, sum(running) AS running,
               sum(scheduled) AS scheduled, sum(dead) AS dead, min(first_vtime) AS first_vtime
        FROM counts GROUP BY 1, 2
    )
    INSERT INTO rota.stats
    SELECT g.queue_id, g.tenant_id, g.waiting, g.running, g.scheduled, g.dead,
           -- Within a tenant and queue, line order is arrival order: its
           -- first task in line is its oldest waiting (an index probe).
           (SELECT t.enqueued_at
            FROM rota.ready r JOIN rota.tasks t ON t.id = r.task_id
            WHERE r.queue_id = g.queue_id AND r.vtime = g.first_vtime
              AND r.tenant_id = g.tenant_id
            ORDER BY r.seq LIMIT 1),
           now()
    FROM grouped g;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
