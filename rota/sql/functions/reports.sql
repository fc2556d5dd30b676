-- Workers' reports on claimed tasks: completions, failures, hand-backs,
-- requeues, lease extensions. Each takes the attempt tokens the claim gave
-- and refuses a stale one. Those that workers call run as the schema's owner,
-- with a fixed search_path: worker roles hold no UPDATE or DELETE.
--
-- Nested loops are off where a statement joins its tasks' rows through
-- `t.id = ANY(the batch's ids)`: as the inner side of a nested loop, that
-- index scan sorts the batch's ids again for every row, quadratic in the
-- batch (5 s for a failure report of 3,000 tasks). Hash joins read the
-- batch's rows once.

-- Hands back claimed tasks whose name the worker's app does not know, for a
-- worker that knows it: each runs again p_delay seconds later with no attempt
-- used, until it has been unknown for p_grace seconds; then it is dead with
-- p_reason. Stale tokens are refused.
CREATE OR REPLACE FUNCTION rota.defer_unknown(
    p_ids uuid[], p_attempts integer[], p_delay double precision, p_grace double precision,
    p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql SET enable_nestloop = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH taken AS MATERIALIZED (
        SELECT r.task_id, r.attempt FROM rota.take_running(p_ids, p_attempts) r
    ), decided AS MATERIALIZED (
        SELECT t.id, k.attempt,
               coalesce(t.unknown_since, now()) <= now() - make_interval(secs => p_grace)
                   AS give_up
        FROM rota.tasks t JOIN taken k ON k.task_id = t.id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM taken))
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now() + make_interval(secs => p_delay), d.id FROM decided d WHERE NOT d.give_up
    )
    UPDATE rota.tasks t
    SET status = CASE WHEN d.give_up THEN 'dead' ELSE 'scheduled' END::rota.task_status,
        unknown_since = coalesce(t.unknown_since, now()),
        attempts = CASE WHEN d.give_up THEN d.attempt ELSE t.attempts END,
        last_error = p_reason,
        finished_at = CASE WHEN d.give_up THEN now() END
    FROM decided d
    WHERE t.id = ANY (ARRAY(SELECT id FROM decided)) AND t.id = d.id
    RETURNING t.id, t.status;
END
$$;

-- Fails claimed tasks: each is retried after its backoff (exponential, with
-- jitter), or at p_retry_at when given (an explicit retry), until its last
-- attempt; then, or at once when p_final (an unknown task, say), it is dead,
-- with its last error and traceback kept. A task cancelled while it ran ends
-- as 'cancelled' instead. Stale tokens are refused.
CREATE OR REPLACE FUNCTION rota.fail(
    p_ids uuid[], p_attempts integer[], p_errors text[], p_retry_at timestamptz[],
    p_final boolean[], p_tracebacks text[] DEFAULT NULL
) RETURNS TABLE (id uuid, status rota.task_status, run_at timestamptz)
LANGUAGE plpgsql SET enable_nestloop = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- Exponential backoff with "equal jitter": half the delay fixed, half random,
-- so that a burst of failures does not retry in lockstep.
CREATE OR REPLACE FUNCTION rota.backoff_seconds(p_attempt integer, p_base double precision,
                                                p_max double precision)
RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT d / 2 + random() * d / 2
    FROM (SELECT least(p_max, p_base * power(2, least(p_attempt - 1, 60))) AS d) x
$$;

-- Puts claimed tasks back in line at the place they had. p_consume says
-- whether the attempt counts: it does for an expired lease or a dead worker
-- (the task may have run), not for a task handed back unstarted at shutdown.
-- A task out of attempts is dead instead, and one cancelled while it ran is
-- cancelled. Returns the ids put back in line.
CREATE OR REPLACE FUNCTION rota.requeue(p_ids uuid[], p_attempts integer[], p_consume boolean,
                                        p_reason text)
RETURNS SETOF uuid
LANGUAGE plpgsql SET enable_nestloop = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
    SELECT r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id, r.priority
    FROM unnest(v_rows) r JOIN rota.tasks t ON t.id = r.task_id
    WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x)) AND t.status = 'pending'
    RETURNING task_id;

    PERFORM pg_notify('rota_ready', q.name)
    FROM rota.queues q WHERE q.id IN (SELECT r.queue_id FROM unnest(v_rows) r);
END
$$;

-- Requeues the tasks whose lease ran out. Without attempt tokens, which
-- count only within a lease (rota.take_running); none is needed: a passed
-- lease's row can no longer change but by its requeue.
CREATE OR REPLACE FUNCTION rota.requeue_expired() RETURNS SETOF uuid
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT rota.requeue(array_agg(task_id), array_fill(NULL::integer, ARRAY[count(*)::integer]),
                        true, 'lease expired')
    FROM rota.running WHERE lease_expires_at < now()
$$;

-- Heartbeat: extends the leases that have not passed; returns the ids still held
-- by these tokens. p_started[i]: the seconds from the task's claim to its
-- run's start, for a task that started (its worker's monotonic measure;
-- NULL: not started), kept as its start once known.
CREATE OR REPLACE FUNCTION rota.extend_leases(p_ids uuid[], p_attempts integer[],
                                              p_lease_seconds double precision,
                                              p_started double precision[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');
BEGIN
    RETURN QUERY
    UPDATE rota.running r
    SET lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        started_at = coalesce(r.started_at, r.claimed_at + make_interval(secs => x.started))
    FROM unnest(p_ids, p_attempts, p_started) AS x(id, attempt, started)
    WHERE r.task_id = x.id AND r.attempt = x.attempt
      -- A lease that passed is not revived (rota.take_running).
      AND r.lease_expires_at > now()
      AND (v_worker IS NULL OR r.worker = v_worker)
    RETURNING r.task_id;
END
$$;
