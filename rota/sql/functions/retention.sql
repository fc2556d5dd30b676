-- Retention duties (rota/consumer/maintenance.py): each prunes what no one
-- needs any more, a bounded batch per run, so that the tables keep their size
-- in a long steady run.

-- Whether the session's login may do anything (no roles made, an admin, the
-- owner, a superuser), or is held to rota.limits.
CREATE OR REPLACE FUNCTION rota.caller_is_admin() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'rota_admin')
        OR pg_has_role(session_user, 'rota_admin', 'MEMBER')
        OR pg_has_role(session_user, 'rota_owner', 'MEMBER')
$$;

-- The interval a retention duty may use: the caller's, but for a caller held
-- to rota.limits never below the floor.
CREATE OR REPLACE FUNCTION rota.retention(p_asked interval, p_floor interval) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN rota.caller_is_admin() THEN p_asked ELSE greatest(p_asked, p_floor) END
$$;

-- Drops up to p_limit records of tasks that succeeded before p_older_than ago,
-- with their last progress.
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
    ), unreported AS (
        DELETE FROM rota.progress WHERE task_id = ANY (ARRAY(SELECT task_id FROM pruned))
    )
    SELECT count(*) FROM pruned
$$;

-- Drops up to p_limit dead or cancelled tasks that ended before p_older_than ago,
-- with their last progress.
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
    ), unreported AS (
        DELETE FROM rota.progress WHERE task_id = ANY (ARRAY(SELECT id FROM pruned))
    )
    SELECT count(*) INTO v_count FROM pruned;
    RETURN v_count;
END
$$;

-- Drops the rows of workers stopped (or declared dead) before p_older_than
-- ago that hold no claim.
CREATE OR REPLACE FUNCTION rota.prune_workers(p_older_than interval) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.workers w
        WHERE w.stopped_at < now() - rota.retention(
                p_older_than, (SELECT l.worker_retention_floor FROM rota.limits l))
          AND NOT EXISTS (SELECT FROM rota.running r WHERE r.worker = w.id)
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Drops ledger rows no replay can need: Spark replays only a checkpoint's
-- latest batches, so each checkpoint keeps the rows of its newest p_keep
-- batches, and any younger than p_older_than.
CREATE OR REPLACE FUNCTION rota.prune_loader_batches(p_older_than interval, p_keep integer)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH ranked AS (
        SELECT query, batch_id, part, loaded_at,
               dense_rank() OVER (PARTITION BY query ORDER BY batch_id DESC) AS nth
        FROM rota.loader_batches
    ), pruned AS (
        DELETE FROM rota.loader_batches b
        USING ranked r
        WHERE b.query = r.query AND b.batch_id = r.batch_id AND b.part = r.part
          AND r.nth > p_keep AND r.loaded_at < now() - p_older_than
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;
