-- rota 0038: the waiters of a batch's results are woken by one notification
-- per 200 results instead of one per result.

-- Completes claimed tasks, as rota.complete_counted, and keeps the results
-- of those completed (p_values[i] or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none), waking their waiters. Returns
-- every task completed, and whether its tenant's count was kept.
CREATE OR REPLACE FUNCTION rota.complete_keeping(p_ids uuid[], p_attempts integer[], p_values jsonb[],
                                      p_refused text[], p_ttls double precision[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT c.task_id, c.counted FROM rota.complete_counted(p_ids, p_attempts) c
    ), kept AS (
        INSERT INTO rota.results (task_id, value, refused, expires_at)
        SELECT k.id, k.value, k.refused, now() + make_interval(secs => k.ttl)
        FROM unnest(p_ids, p_values, p_refused, p_ttls) AS k (id, value, refused, ttl)
        JOIN done d ON d.task_id = k.id
        WHERE k.ttl IS NOT NULL
        ON CONFLICT (task_id) DO NOTHING
        RETURNING task_id
    )
    -- One notification per 200 results, their ids comma-separated (under the
    -- 8000-byte payload cap): a waiter looks for its own id in it.
    SELECT d.task_id, d.counted
    FROM done d, (
        SELECT count(pg_notify('rota_results', c.ids))
        FROM (
            SELECT string_agg(n.task_id::text, ',') AS ids
            FROM (SELECT k.task_id, (row_number() OVER ()) / 200 AS chunk FROM kept k) n
            GROUP BY n.chunk
        ) c
    ) woken;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
