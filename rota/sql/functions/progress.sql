-- Progress of running tasks (rota.context().progress, docs/howto/results.md):
-- a worker stores the latest values of its tasks at most about once a second,
-- all of them in one statement; readers get the last one, kept after the task
-- ends for as long as its record (retention prunes it with the record).

-- Stores the progress of tasks by their attempt tokens: p_done[i] of
-- p_totals[i] (NULL: no total), with p_messages[i], for task p_ids[i] at
-- attempt p_attempts[i]. A token counts while its lease is held (by the acting
-- worker, for a worker role), or once its task has ended by that very attempt
-- (the last values of a task that ended before they were stored). Values out
-- of bounds are skipped (the worker checks them first); an older attempt's
-- never replace a newer one's. Returns the ids stored.
CREATE OR REPLACE FUNCTION rota.report_progress(
    p_ids uuid[], p_attempts integer[], p_done double precision[], p_totals double precision[],
    p_messages text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');
BEGIN
    RETURN QUERY
    INSERT INTO rota.progress AS p (task_id, attempt, done, total, message)
    SELECT x.id, x.attempt, x.done, x.total, left(x.message, 500)
    FROM unnest(p_ids, p_attempts, p_done, p_totals, p_messages)
         AS x(id, attempt, done, total, message)
    -- NaN sorts above Infinity: `< 'Infinity'` refuses both.
    WHERE x.done >= 0 AND x.done < 'Infinity'
      AND (x.total IS NULL OR (x.total >= x.done AND x.total < 'Infinity'))
      AND CASE WHEN EXISTS (SELECT FROM rota.running r WHERE r.task_id = x.id)
               THEN EXISTS (SELECT FROM rota.running r
                            WHERE r.task_id = x.id AND r.attempt = x.attempt
                              AND r.lease_expires_at > now()
                              AND (v_worker IS NULL OR r.worker = v_worker))
               ELSE EXISTS (SELECT FROM rota.finished f
                            WHERE f.task_id = x.id AND f.attempts = x.attempt)
                 OR EXISTS (SELECT FROM rota.tasks t
                            WHERE t.id = x.id AND t.attempts = x.attempt
                              AND t.status <> 'pending')
          END
    ON CONFLICT (task_id) DO UPDATE
    SET attempt = excluded.attempt, done = excluded.done, total = excluded.total,
        message = excluded.message, reported_at = now(), writes = p.writes + 1
    WHERE p.attempt <= excluded.attempt
    RETURNING p.task_id;
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_report_progress(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[],
    p_done double precision[], p_totals double precision[], p_messages text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.report_progress(p_ids, p_attempts, p_done, p_totals,
                                                    p_messages);
END
$$;

-- A task's last progress, for its result's waiter (rota.Result.progress).
CREATE OR REPLACE FUNCTION rota.task_progress(p_id uuid)
RETURNS TABLE (attempt integer, done double precision, total double precision, message text,
               reported_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT p.attempt, p.done, p.total, p.message, p.reported_at
    FROM rota.progress p WHERE p.task_id = p_id
$$;
