-- Results (docs/howto/results.md): kept with the completion, in its
-- transaction, for the tasks that ask for them; read by id; pruned once
-- expired.

-- Completes claimed tasks, as rota.complete_counted, and keeps the results
-- of those completed (p_values[i] or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none), waking their waiters. Returns
-- every task completed, and whether its tenant's count was kept. p_started
-- and p_ran: the runs' measures, as rota.complete takes them.
CREATE OR REPLACE FUNCTION rota.complete_keeping(p_ids uuid[], p_attempts integer[],
                                                 p_values jsonb[], p_refused text[],
                                                 p_ttls double precision[],
                                                 p_started double precision[] DEFAULT NULL,
                                                 p_ran double precision[] DEFAULT NULL)
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT c.task_id, c.counted
        FROM rota.complete_counted(p_ids, p_attempts, p_started, p_ran) c
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

-- Wakes the waiters of tasks that ended without a result (dead, cancelled).
CREATE OR REPLACE FUNCTION rota.wake_result_waiters(p_ids uuid[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_notify('rota_results', id::text) FROM unnest(p_ids) AS id;
$$;

-- What became of a task, for its result's waiter: its state, and the result
-- (or the refusal) once it succeeded, or the error and traceback it died of.
-- `kept`: a result row was found; past `expires_at` its value is gone.
CREATE OR REPLACE FUNCTION rota.task_result(p_id uuid)
RETURNS TABLE (status text, value jsonb, refused text, kept boolean, error text,
               traceback text, finished_at timestamptz, expires_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM rota.running r WHERE r.task_id = t.id)
                THEN 'running' ELSE t.status::text END,
           NULL::jsonb, NULL::text, false, t.last_error, t.traceback, t.finished_at,
           NULL::timestamptz
    FROM rota.tasks t WHERE t.id = p_id
    UNION ALL
    SELECT 'succeeded', CASE WHEN r.expires_at > now() THEN r.value END,
           CASE WHEN r.expires_at > now() THEN r.refused END, r.task_id IS NOT NULL, NULL,
           NULL, f.finished_at, r.expires_at
    FROM rota.finished f
    LEFT JOIN rota.results r ON r.task_id = f.task_id
    WHERE f.task_id = p_id
$$;

-- Up to p_limit results past their time lose their value (their row stays,
-- to say "expired", while their task's record lasts); up to p_limit expired
-- ones whose task's record is gone go. Returns the rows changed.
CREATE OR REPLACE FUNCTION rota.prune_results(p_limit integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH expired AS (
        UPDATE rota.results SET value = NULL, refused = NULL
        WHERE task_id = ANY (ARRAY(
            SELECT r.task_id FROM rota.results r
            WHERE r.expires_at <= now() AND r.value IS NOT NULL LIMIT p_limit))
        RETURNING 1
    ), forgotten AS (
        DELETE FROM rota.results WHERE task_id = ANY (ARRAY(
            SELECT r.task_id FROM rota.results r
            WHERE r.value IS NULL
              AND NOT EXISTS (SELECT 1 FROM rota.finished f WHERE f.task_id = r.task_id)
            LIMIT p_limit))
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM expired) + (SELECT count(*) FROM forgotten)
$$;
