-- rota 0037: results kept for the tasks that ask for them; a cancel reaches
-- the worker running the task (NOTIFY rota_cancel).

-- Results, kept for the tasks that ask for them (`@app.task(result_ttl=...)`):
-- the return value as JSON, or why it was refused (too big, not JSON), until
-- it expires. Written with the completion, in its transaction; a waiter is
-- woken by NOTIFY on rota_results with the task's id.
CREATE TABLE rota.results (
    task_id uuid PRIMARY KEY,
    value jsonb,  -- NULL when refused, or once expired
    refused text,  -- why no value is kept: it was too big, or not JSON
    expires_at timestamptz NOT NULL
);
CREATE INDEX results_expire ON rota.results (expires_at) WHERE value IS NOT NULL;
-- Expired results keep their row (it tells "expired" from "unknown") while
-- their task's record lasts.
CREATE INDEX results_expired ON rota.results (task_id) WHERE value IS NULL;

-- Completes claimed tasks, as rota.complete_counted, and keeps the results
-- of those completed (p_values[i] or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none), waking their waiters. Returns
-- every task completed, and whether its tenant's count was kept.
CREATE FUNCTION rota.complete_keeping(p_ids uuid[], p_attempts integer[], p_values jsonb[],
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
    SELECT d.task_id, d.counted
    FROM done d, (SELECT count(pg_notify('rota_results', k.task_id::text)) FROM kept k) woken;
END
$$;

CREATE FUNCTION rota.worker_complete_keeping(p_worker text, p_secret bytea, p_ids uuid[],
                                             p_attempts integer[], p_values jsonb[],
                                             p_refused text[], p_ttls double precision[])
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT c.task_id FROM rota.complete_keeping(p_ids, p_attempts, p_values,
                                                             p_refused, p_ttls) c;
END
$$;

-- Wakes the waiters of tasks that ended without a result (dead, cancelled).
CREATE FUNCTION rota.wake_result_waiters(p_ids uuid[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_notify('rota_results', id::text) FROM unnest(p_ids) AS id;
$$;

-- What became of a task, for its result's waiter: its state, and the result
-- (or the refusal) once it succeeded, or the error and traceback it died of.
-- `kept`: a result row was found; past `expires_at` its value is gone.
CREATE FUNCTION rota.task_result(p_id uuid)
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
CREATE FUNCTION rota.prune_results(p_limit integer) RETURNS bigint
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

-- Cancelling tells the worker that holds a task, and wakes result waiters.
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

-- rota.complete_claim for a batch whose completions keep results: each
-- task's result (p_values[i], or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none) kept with its completion, the
-- waiters woken, then the claim, in one statement.
CREATE FUNCTION rota.complete_keeping_claim(p_ids uuid[], p_attempts integer[],
                                            p_values jsonb[], p_refused text[],
                                            p_ttls double precision[], p_queues text[],
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
    FROM rota.complete_keeping(p_ids, p_attempts, p_values, p_refused, p_ttls) c;
    RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz,
                        v_completed, NOT v_locked;
    IF NOT v_locked THEN
        RETURN QUERY SELECT c.*, NULL::integer, NULL::boolean
                     FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds) c;
    END IF;
END
$$;

CREATE FUNCTION rota.worker_complete_keeping_claim(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_values jsonb[],
    p_refused text[], p_ttls double precision[], p_queues text[], p_limit integer,
    p_lease_seconds double precision
)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete_keeping_claim(p_ids, p_attempts, p_values,
                                                           p_refused, p_ttls, p_queues, p_limit,
                                                           p_worker, p_lease_seconds);
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
