-- rota 0039: workflows. A join waits, holding no place in line, until each of
-- its members has succeeded; members' completions count it down in their own
-- transaction; a member's death makes it dead, its retry lets it wait again.

-- Workflows (rota.workflow): a join is a task that waits, holding no place
-- in line, no slot and no concurrency count, until each of its members has
-- succeeded. A member's completion counts its join down in the completion's
-- own transaction (rota.complete_counted), so a join enters the line exactly
-- once. While it waits a join is 'scheduled' with no row in rota.scheduled;
-- the last member's completion gives it one, due now, and maintenance puts it
-- in line with its members' results as its first argument.
CREATE TABLE rota.joins (
    task_id uuid PRIMARY KEY,
    members integer NOT NULL CONSTRAINT members_positive CHECK (members > 0),
    waiting integer NOT NULL CONSTRAINT waiting_bounded CHECK (waiting BETWEEN 0 AND members),
    -- 'one': the first argument is the one member's result (a chain's step);
    -- 'list': the list of the members' results, in their order (a group's join).
    results text NOT NULL CONSTRAINT results_kind CHECK (results IN ('one', 'list')),
    -- The join's own payload, which its members' results are put before.
    payload json NOT NULL,
    -- The member whose death or cancel made the join dead (retrying it lets
    -- the join wait again).
    failed_member uuid,
    -- Its count reached zero: it was made due (once).
    released boolean NOT NULL DEFAULT false
) WITH (
    -- Room on the page: a countdown changes no indexed column, so that each
    -- member's completion rewrites the row in place (HOT).
    fillfactor = 50
);
-- Whether any join waits: completions look for members only then.
CREATE INDEX joins_waiting ON rota.joins (task_id) WHERE NOT released;

CREATE TABLE rota.members (
    task_id uuid PRIMARY KEY,  -- a task has one join at most: a graph is a tree
    join_id uuid NOT NULL REFERENCES rota.joins (task_id) ON DELETE CASCADE,
    position integer NOT NULL  -- its result's place among the join's members
);
CREATE INDEX members_of_join ON rota.members (join_id, position);

-- Counts down the joins of those of p_ids that are members; returns the
-- joins that stopped waiting. The update walks the joins in id order (the
-- plan is pinned to a nested loop over the sorted counts), so that it locks
-- them in that order, as every countdown does: completions of members of the
-- same joins cannot deadlock.
CREATE FUNCTION rota.count_down_joins(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM rota.joins WHERE NOT released) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH counted AS MATERIALIZED (
        SELECT m.join_id, count(*)::integer AS n
        FROM rota.members m WHERE m.task_id = ANY (p_ids)
        GROUP BY m.join_id ORDER BY m.join_id
    ), counted_down AS (
        UPDATE rota.joins j SET waiting = j.waiting - c.n, released = j.waiting = c.n
        FROM counted c
        WHERE j.task_id = c.join_id AND NOT j.released
        RETURNING j.task_id, j.released
    )
    SELECT d.task_id FROM counted_down d WHERE d.released;
END
$$;

-- A join's payload as it runs: its members' results (the one member's, or
-- the list in their order; null where none was kept) before its own arguments.
CREATE FUNCTION rota.joined_payload(p_join uuid) RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT (jsonb_build_object('args', jsonb_build_array(
                CASE j.results
                    WHEN 'one' THEN (SELECT r.value FROM rota.members m
                                     LEFT JOIN rota.results r ON r.task_id = m.task_id
                                     WHERE m.join_id = j.task_id)
                    ELSE (SELECT coalesce(jsonb_agg(r.value ORDER BY m.position), '[]')
                          FROM rota.members m LEFT JOIN rota.results r ON r.task_id = m.task_id
                          WHERE m.join_id = j.task_id)
                END) || (j.payload::jsonb -> 'args'))
            || (j.payload::jsonb - 'args'))::json
    FROM rota.joins j WHERE j.task_id = p_join
$$;

-- A member that dies or is cancelled makes its waiting join dead with the
-- reason (and so on up, the join being a task like any); retrying the member
-- lets the join wait again.
CREATE FUNCTION rota.member_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_join uuid;
BEGIN
    UPDATE rota.joins j SET failed_member = NEW.id
    FROM rota.members m
    WHERE m.task_id = NEW.id AND j.task_id = m.join_id AND NOT j.released
      AND j.failed_member IS NULL
    RETURNING j.task_id INTO v_join;
    IF v_join IS NOT NULL THEN
        UPDATE rota.tasks t
        SET status = 'dead', finished_at = now(),
            last_error = format('member %s %s: %s', NEW.id,
                                CASE NEW.status WHEN 'dead' THEN 'died' ELSE 'was cancelled' END,
                                coalesce(NEW.last_error, 'no error recorded'))
        WHERE t.id = v_join AND t.status = 'scheduled';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER member_ended AFTER UPDATE OF status ON rota.tasks
    FOR EACH ROW
    WHEN (NEW.status IN ('dead', 'cancelled') AND OLD.status NOT IN ('dead', 'cancelled'))
    EXECUTE FUNCTION rota.member_ended();

CREATE FUNCTION rota.member_revived() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_join uuid;
BEGIN
    UPDATE rota.joins j SET failed_member = NULL
    FROM rota.members m
    WHERE m.task_id = NEW.id AND j.task_id = m.join_id AND j.failed_member = NEW.id
    RETURNING j.task_id INTO v_join;
    IF v_join IS NOT NULL THEN
        UPDATE rota.tasks t
        SET status = 'scheduled', finished_at = NULL,
            last_error = format('waits again: member %s was retried', NEW.id)
        WHERE t.id = v_join AND t.status = 'dead';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER member_revived AFTER UPDATE OF status ON rota.tasks
    FOR EACH ROW
    WHEN (OLD.status IN ('dead', 'cancelled') AND NEW.status NOT IN ('dead', 'cancelled'))
    EXECUTE FUNCTION rota.member_revived();

-- rota.complete's work, saying of each task completed whether its tenant's
-- running counter counted it (its tenant row was locked to uncount it).
CREATE OR REPLACE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key: a join on
    -- a function's result is estimated at 1000 rows and turns into a seq scan.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT r.task_id, r.queue_id, r.tenant_id, r.attempt, r.claimed_at, r.counted
        FROM rota.take_running(p_ids, p_attempts) r
    ), gone AS (
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT d.task_id FROM done d))
        RETURNING t.id, t.enqueued_at, t.max_attempts, t.cost
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                                   max_attempts, cost)
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at,
               g.max_attempts, g.cost
        FROM done d JOIN gone g ON g.id = d.task_id
        RETURNING task_id
    ), released AS (
        -- The joins whose last member this was: due now (still waiting, not
        -- dead or cancelled meanwhile).
        -- The countdown drives the statement (a function scan), never a
        -- subquery that the plan may skip; it runs only while some join
        -- waits (one probe of joins_waiting otherwise).
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now(), j.id
        FROM (SELECT WHERE EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)) gate,
             LATERAL rota.count_down_joins(ARRAY(SELECT task_id FROM done)) AS j(id)
        WHERE (SELECT t.status FROM rota.tasks t WHERE t.id = j.id) = 'scheduled'
    )
    SELECT s.task_id, d.counted FROM stored s JOIN done d ON d.task_id = s.task_id;
END
$$;

-- Due scheduled tasks (ETA reached, retry backoff over), back to pending; they
-- get their fair place in line from rota.core.make_ready.
CREATE OR REPLACE FUNCTION rota.take_due(p_limit integer)
RETURNS TABLE (id uuid, seq bigint, queue_id integer, tenant_id integer,
               cost double precision, priority smallint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        DELETE FROM rota.scheduled
        WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM rota.scheduled WHERE run_at <= now()
            ORDER BY run_at LIMIT p_limit FOR UPDATE SKIP LOCKED))
        RETURNING task_id
    ), joined AS MATERIALIZED (
        -- Joins run with their members' results before their own arguments.
        SELECT j.task_id FROM rota.joins j WHERE j.task_id = ANY (ARRAY(SELECT task_id FROM due))
    ), promoted AS (
        UPDATE rota.tasks t
        SET status = 'pending',
            payload = CASE WHEN t.id = ANY (ARRAY(SELECT task_id FROM joined))
                           THEN rota.joined_payload(t.id) ELSE t.payload END
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM due)) AND t.status = 'scheduled'
        RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.priority
    )
    SELECT p.id, p.seq, p.queue_id, p.tenant_id, p.cost, p.priority FROM promoted p
    ORDER BY p.seq;
END
$$;

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
    )
    SELECT v_now || coalesce(array_agg(task_id), '{}') INTO v_now FROM unready;
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

-- Drops up to p_limit records of tasks that succeeded before p_older_than ago.
CREATE OR REPLACE FUNCTION rota.prune_finished(p_older_than interval, p_limit integer)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.finished WHERE task_id = ANY (ARRAY(
            SELECT f.task_id FROM rota.finished f
            WHERE f.finished_at < now() - rota.retention(
                p_older_than, (SELECT l.finished_retention_floor FROM rota.limits l))
            LIMIT p_limit))
        RETURNING task_id
    ), unjoined AS (
        DELETE FROM rota.joins WHERE task_id = ANY (ARRAY(SELECT task_id FROM pruned))
    )
    SELECT count(*) FROM pruned
$$;

-- Drops up to p_limit dead or cancelled tasks that ended before p_older_than ago.
CREATE OR REPLACE FUNCTION rota.prune_dead(p_older_than interval, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_older_than interval := rota.retention(
        p_older_than, (SELECT l.dead_retention_floor FROM rota.limits l));
    v_count bigint;
BEGIN
    WITH pruned AS (
        DELETE FROM rota.tasks WHERE id = ANY (ARRAY(
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'dead' AND t.finished_at < now() - v_older_than
            UNION ALL
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'cancelled' AND t.finished_at < now() - v_older_than
            LIMIT p_limit))
        AND status IN ('dead', 'cancelled')
        RETURNING id
    ), unjoined AS (
        DELETE FROM rota.joins WHERE task_id = ANY (ARRAY(SELECT id FROM pruned))
    )
    SELECT count(*) INTO v_count FROM pruned;
    RETURN v_count;
END
$$;

-- Stores a workflow's joins and members (rota.workflow), in the transaction
-- that loaded its new tasks: the joins were loaded scheduled at p_waiting_at,
-- and are taken off the schedule here to wait. A member stored before
-- (rota.workflow.after) must be known, of p_tenant, neither dead nor
-- cancelled, and in no other join; one that succeeded counts as done.
-- Refuses a bad graph with the reason (nothing of it stays).
CREATE FUNCTION rota.add_workflow(
    p_joins uuid[], p_results text[], p_payloads json[],
    p_members uuid[], p_member_joins uuid[], p_positions integer[],
    p_tenant text, p_waiting_at timestamptz
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bad record;
BEGIN
    -- Held until the transaction ends: a member cannot complete unseen.
    PERFORM FROM rota.tasks t WHERE t.id = ANY (p_members) ORDER BY t.id FOR SHARE;
    WITH found AS (
        SELECT x.id,
               coalesce((SELECT t.status::text FROM rota.tasks t WHERE t.id = x.id),
                        (SELECT 'succeeded' FROM rota.finished f WHERE f.task_id = x.id))
                   AS status,
               coalesce((SELECT coalesce(t.tenant, n.name) FROM rota.tasks t
                         JOIN rota.tenants n ON n.id = t.tenant_id WHERE t.id = x.id),
                        (SELECT n.name FROM rota.finished f
                         JOIN rota.tenants n ON n.id = f.tenant_id WHERE f.task_id = x.id))
                   AS tenant,
               (SELECT m.join_id FROM rota.members m WHERE m.task_id = x.id) AS other_join
        FROM unnest(p_members) AS x(id)
    )
    SELECT * INTO v_bad FROM found f
    WHERE f.status IS NULL OR f.status NOT IN ('pending', 'scheduled', 'succeeded')
       OR f.tenant <> p_tenant OR f.other_join IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%', CASE
            WHEN v_bad.status IS NULL THEN format('a join on an unknown task: %s', v_bad.id)
            WHEN v_bad.tenant <> p_tenant THEN format(
                'task %s is tenant %s''s: a workflow''s tasks are all one tenant''s (%s)',
                v_bad.id, v_bad.tenant, p_tenant)
            WHEN v_bad.other_join IS NOT NULL THEN format(
                'task %s is already a member of join %s: a task has one join at most',
                v_bad.id, v_bad.other_join)
            ELSE format('task %s is %s: retry it before joining it', v_bad.id, v_bad.status)
        END;
    END IF;
    DELETE FROM rota.scheduled s WHERE s.run_at = p_waiting_at AND s.task_id = ANY (p_joins);
    INSERT INTO rota.joins (task_id, members, waiting, results, payload, released)
    SELECT j.id, c.n, c.waiting, j.results, j.payload, c.waiting = 0
    FROM unnest(p_joins, p_results, p_payloads) AS j(id, results, payload)
    JOIN (SELECT m.join_id, count(*)::integer AS n,
                 count(*) FILTER (WHERE NOT EXISTS (
                     SELECT FROM rota.finished f WHERE f.task_id = m.member))::integer AS waiting
          FROM unnest(p_members, p_member_joins) AS m(member, join_id)
          GROUP BY m.join_id) c ON c.join_id = j.id;
    INSERT INTO rota.members (task_id, join_id, position)
    SELECT * FROM unnest(p_members, p_member_joins, p_positions);
    -- A join whose members had all succeeded already is due now.
    INSERT INTO rota.scheduled (run_at, task_id)
    SELECT now(), j.task_id FROM rota.joins j
    WHERE j.task_id = ANY (p_joins) AND j.released;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
