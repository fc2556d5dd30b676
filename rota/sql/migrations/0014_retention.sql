-- Retention duties (rota/consumer/maintenance.py): each prunes what no one
-- needs any more, a bounded batch per run, so that the tables keep their size
-- in a long steady run. Workers run them, through SECURITY DEFINER functions.

-- Dead tasks by age: a small index (dead ones only) keeps the duty off the
-- wide table's pages.
CREATE INDEX tasks_dead ON rota.tasks (finished_at) WHERE status = 'dead';

DROP FUNCTION rota.prune_finished(interval);

-- Drops up to p_limit records of tasks that succeeded before p_older_than ago.
CREATE FUNCTION rota.prune_finished(p_older_than interval, p_limit integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.finished WHERE task_id = ANY (ARRAY(
            SELECT f.task_id FROM rota.finished f
            WHERE f.finished_at < now() - p_older_than LIMIT p_limit))
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Drops up to p_limit dead tasks that died before p_older_than ago.
CREATE FUNCTION rota.prune_dead(p_older_than interval, p_limit integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.tasks WHERE id = ANY (ARRAY(
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'dead' AND t.finished_at < now() - p_older_than LIMIT p_limit))
        AND status = 'dead'
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Drops the rows of workers stopped (or declared dead) before p_older_than
-- ago that hold no claim.
CREATE FUNCTION rota.prune_workers(p_older_than interval) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.workers w
        WHERE w.stopped_at < now() - p_older_than
          AND NOT EXISTS (SELECT FROM rota.running r WHERE r.worker = w.id)
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Drops ledger rows no replay can need: Spark replays only a checkpoint's
-- latest batches, so each checkpoint keeps its newest p_keep rows, and any
-- younger than p_older_than.
CREATE FUNCTION rota.prune_loader_batches(p_older_than interval, p_keep integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH ranked AS (
        SELECT query, batch_id, loaded_at,
               row_number() OVER (PARTITION BY query ORDER BY batch_id DESC) AS nth
        FROM rota.loader_batches
    ), pruned AS (
        DELETE FROM rota.loader_batches b
        USING ranked r
        WHERE b.query = r.query AND b.batch_id = r.batch_id
          AND r.nth > p_keep AND r.loaded_at < now() - p_older_than
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Claims still held by workers that stopped (or were declared dead) more
-- than p_after ago: a worker that died during its shutdown, or one declared
-- dead that claimed before it learned so. Returns their task ids, to requeue.
CREATE FUNCTION rota.stopped_workers_claims(p_after interval) RETURNS SETOF uuid
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.task_id FROM rota.running r
    JOIN rota.workers w ON w.id = r.worker
    WHERE w.stopped_at < now() - p_after
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
