-- Workflows (docs/howto/workflows.md): joins that wait for their members
-- (rota.joins, rota.members), counted down by the members' completions.

-- Counts down p_joins, each once per member of it completed (the members'
-- rota.tasks.join_id); returns the joins that stopped waiting. The update
-- walks the joins in id order (the plan is pinned to a nested loop over the
-- sorted counts), so that it locks them in that order, as every countdown
-- does: completions of members of the same joins cannot deadlock.
CREATE OR REPLACE FUNCTION rota.count_down_joins(p_joins uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH counted AS MATERIALIZED (
        SELECT c.join_id, count(*)::integer AS n
        FROM unnest(p_joins) AS c(join_id)
        GROUP BY c.join_id ORDER BY c.join_id
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
CREATE OR REPLACE FUNCTION rota.joined_payload(p_join uuid) RETURNS json
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
CREATE OR REPLACE FUNCTION rota.member_ended() RETURNS trigger
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

CREATE OR REPLACE FUNCTION rota.member_revived() RETURNS trigger
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

-- Stores a workflow's joins and members (rota.workflow), in the transaction
-- that loaded its new tasks: the joins were loaded scheduled at p_waiting_at,
-- and are taken off the schedule here to wait. A member stored before
-- (rota.workflow.after) must be known, of p_tenant, neither dead nor
-- cancelled, and in no other join; one that succeeded counts as done.
-- Refuses a bad graph with the reason (nothing of it stays).
CREATE OR REPLACE FUNCTION rota.add_workflow(
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
    -- Each member's row names its join (rota.tasks.join_id): loaded with it
    -- (rota.core.load), or here for a member stored before, or by a loader
    -- that does not write it.
    UPDATE rota.tasks t SET join_id = m.join_id
    FROM unnest(p_members, p_member_joins) AS m(member, join_id)
    WHERE t.id = m.member AND t.join_id IS DISTINCT FROM m.join_id;
    -- A join whose members had all succeeded already is due now.
    INSERT INTO rota.scheduled (run_at, task_id)
    SELECT now(), j.task_id FROM rota.joins j
    WHERE j.task_id = ANY (p_joins) AND j.released;
END
$$;
