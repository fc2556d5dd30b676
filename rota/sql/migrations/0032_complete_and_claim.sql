-- rota 0032: a worker completes its finished tasks and claims its next batch
-- in one statement (rota.complete_claim): one round trip and one transaction
-- where a report and a claim took two each.

-- rota.complete's work, saying of each task completed whether its tenant's
-- running counter counted it (its tenant row was locked to uncount it).
CREATE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[])
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
        RETURNING t.id, t.enqueued_at
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at)
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at
        FROM done d JOIN gone g ON g.id = d.task_id
        RETURNING task_id
    )
    SELECT s.task_id, d.counted FROM stored s JOIN done d ON d.task_id = s.task_id;
END
$$;

CREATE OR REPLACE FUNCTION rota.complete(p_ids uuid[], p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT c.task_id FROM rota.complete_counted(p_ids, p_attempts) c;
END
$$;

-- Completes claimed tasks (stale tokens refused), then claims up to p_limit
-- as rota.claim does. The first row carries the outcome and no task: how many
-- were completed, and whether the claim ran. It does not run when a
-- completion locked a limited tenant's row: a claim locks tenant rows too,
-- and two workers each holding one tenant's lock while the other's claim asks
-- for it would deadlock; the worker then claims in a statement of its own, as
-- separate transactions always could. The claimed tasks follow, in fair order.
CREATE FUNCTION rota.complete_claim(p_ids uuid[], p_attempts integer[], p_queues text[],
                                    p_limit integer, p_worker text,
                                    p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_completed integer;
    v_locked boolean;
BEGIN
    SELECT count(*), coalesce(bool_or(c.counted), false) INTO v_completed, v_locked
    FROM rota.complete_counted(p_ids, p_attempts) c;
    RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz,
                        v_completed, NOT v_locked;
    IF NOT v_locked THEN
        RETURN QUERY SELECT c.*, NULL::integer, NULL::boolean
                     FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds) c;
    END IF;
END
$$;

CREATE FUNCTION rota.worker_complete_claim(p_worker text, p_secret bytea, p_ids uuid[],
                                           p_attempts integer[], p_queues text[],
                                           p_limit integer, p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete_claim(p_ids, p_attempts, p_queues, p_limit,
                                                   p_worker, p_lease_seconds);
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
