-- Workers' reports on claimed tasks: completions, failures, hand-backs,
-- requeues, lease extensions. Each takes the attempt tokens the claim gave
-- and refuses a stale one. Those that workers call run as the schema's owner,
-- with a fixed search_path: worker roles hold no UPDATE or DELETE.

-- Takes claimed tasks off the running table, keeping each limited tenant's
-- and key's counter right. Tenant rows, then key rows, are locked in id
-- order, as claims lock them. A hash join of the tokens: planned on a
-- near-empty running table, the join became a nested loop that compared
-- every running row with every token (2 ms for 100 completions, and
-- quadratic in a mass requeue); enable_nestloop is off where it runs. So is
-- JIT in the completion's statement: the join release's nested loop, costed
-- at 1e10 when disabled, would have it compiled on every call in a session
-- that leaves JIT on.
--
-- Its CTEs are one text (v_take): the statement of rota.take_running (for
-- failures, hand-backs, requeues) and the head of the completion's, so that
-- a completion runs in one function: a nested function call costs every
-- report a call and a copy of its rows. Most completions are one short
-- statement (v_lean); the whole one runs only for what that left. A DO
-- block puts the functions together (EXECUTE format()). In plpgsql, each
-- keeps its plan.
DO $make$
DECLARE
    -- %1$s: more conditions on the running rows taken.
    v_take_rows constant text := $part$
    WITH taken AS MATERIALIZED (
        DELETE FROM rota.running r
        USING unnest(p_ids, p_attempts) AS x(id, attempt)
        -- The ANY keeps the planner on the key however many tasks are running.
        WHERE r.task_id = ANY (p_ids) AND r.task_id = x.id
          -- A worker's report (an attempt token) counts only within its
          -- lease: past it the worker holds nothing (the task is requeued
          -- and may run elsewhere), whatever kept it silent.
          AND (x.attempt IS NULL OR (r.attempt = x.attempt AND r.lease_expires_at > now()))
          AND (v_worker IS NULL OR r.worker = v_worker)%1$s
        RETURNING r.*$part$;
    v_uncount constant text := $part$
    ), counted AS (
        SELECT tenant_id, count(*) AS n FROM taken WHERE counted GROUP BY tenant_id
    ), locked AS MATERIALIZED (
        -- Nothing is locked when no limited tenant is among them.
        SELECT t.id FROM rota.tenants t
        WHERE t.id = ANY (ARRAY(SELECT tenant_id FROM counted))
        ORDER BY t.id FOR UPDATE
    ), uncounted AS (
        UPDATE rota.tenants t SET running = greatest(t.running - c.n, 0)
        FROM counted c
        WHERE t.id = ANY (ARRAY(SELECT id FROM locked)) AND t.id = c.tenant_id
    ), keys_counted AS (
        SELECT key_id, count(*) AS n FROM taken WHERE key_id IS NOT NULL GROUP BY key_id
    ), keys_locked AS MATERIALIZED (
        -- After the tenants' rows (the subquery on `locked` runs first), as
        -- claims lock them; nothing is locked when no key counts.
        SELECT k.id FROM rota.keys k
        WHERE k.id = ANY (ARRAY(SELECT key_id FROM keys_counted))
          AND (SELECT count(*) FROM locked) >= 0
        ORDER BY k.id FOR UPDATE
    ), keys_uncounted AS (
        UPDATE rota.keys k SET running = greatest(k.running - c.n, 0)
        FROM keys_counted c
        WHERE k.id = ANY (ARRAY(SELECT id FROM keys_locked)) AND k.id = c.key_id$part$;
    -- The tasks of %1$I leave rota.tasks (a delete is far cheaper than
    -- rewriting the wide row) for the narrow rota.finished log.
    v_stored constant text := $part$
    ), gone AS (
        -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key.
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT d.task_id FROM %1$I d))
        RETURNING t.id, t.enqueued_at, t.max_attempts, t.cost, t.join_id
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                                   max_attempts, cost)
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at,
               g.max_attempts, g.cost
        FROM %1$I d JOIN gone g ON g.id = d.task_id
        RETURNING task_id$part$;
    v_done_rows constant text := $part$
    ), done AS MATERIALIZED (
        -- Read after keys_locked: tenant and key rows are locked before the
        -- tasks' rows, as when the tasks were taken in a statement of their own.
        SELECT t.task_id, t.queue_id, t.tenant_id, t.attempt, t.claimed_at, t.counted, t.key_id
        FROM taken t
        WHERE (SELECT count(*) FROM keys_locked) >= 0$part$;
    -- A join whose last member this was is released.
    v_release constant text := $part$
    ), released AS (
        -- The joins whose last member this was: due now (still waiting, not
        -- dead or cancelled meanwhile).
        -- The countdown drives the statement (a function scan), never a
        -- subquery that the plan may skip; it runs only while some join
        -- waits (one probe of joins_waiting otherwise).
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now(), j.id
        FROM (SELECT WHERE EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)) gate,
             LATERAL rota.count_down_joins(
                 ARRAY(SELECT g.join_id FROM gone g WHERE g.join_id IS NOT NULL)) AS j(id)
        WHERE (SELECT t.status FROM rota.tasks t WHERE t.id = j.id) = 'scheduled'
    )$part$;
    -- Completes the tasks counted for no tenant and no key, while no join
    -- waits (most): no tenant or key row to lock and uncount, no join to
    -- release. The rest, if any, go through the whole statement after it.
    -- Only rows as they are when deleted qualify: one counted meanwhile (a
    -- limit set) waits for the whole statement.
    v_lean_rows constant text := $part$
          AND NOT r.counted AND r.key_id IS NULL
          AND NOT EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)$part$;
    v_take text;  -- taking (rota.take_running), the head of a completion
    v_complete text;  -- the rest of a completion
    v_lean text;  -- the lean completion
    v_completing text;
    -- Set by rota.check_worker: a worker takes only what it holds.
    v_worker constant text := $part$
DECLARE
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');$part$;
BEGIN
    v_take := format(v_take_rows, '') || v_uncount;
    v_complete := v_done_rows || format(v_stored, 'done') || v_release;
    v_lean := format(v_take_rows, v_lean_rows) || format(v_stored, 'taken') || E'\n    )';
    -- A completion's body: the lean statement, then the whole one for what
    -- it left; %1$s and %2$s: what each returns of the tasks completed.
    v_completing := v_worker || $part$
    v_done integer;
BEGIN
    RETURN QUERY$part$ || v_lean || $part$
    %1$s;
    GET DIAGNOSTICS v_done = ROW_COUNT;
    IF v_done < cardinality(p_ids) THEN
        RETURN QUERY$part$ || v_take || v_complete || $part$
        %2$s;
    END IF;
END
$part$;
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION rota.take_running(p_ids uuid[], p_attempts integer[])
RETURNS SETOF rota.running
LANGUAGE plpgsql SET enable_nestloop = off AS $body$%s
BEGIN
    RETURN QUERY%s
    )
    SELECT * FROM taken;
END
$body$$function$, v_worker, v_take);
    -- rota.complete's work, saying of each task completed whether its
    -- tenant's running counter counted it (its tenant row was locked to
    -- uncount it): for rota.complete_claim and rota.complete_keeping.
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql SET enable_nestloop = off SET jit = off AS $body$
#variable_conflict use_column%s$body$$function$,
        format(v_completing, 'SELECT s.task_id, false FROM stored s',
               'SELECT s.task_id, d.counted OR d.key_id IS NOT NULL
        FROM stored s JOIN done d ON d.task_id = s.task_id'));
    -- Finishes claimed tasks successfully. Returns the ids completed; an id
    -- whose attempt token is stale (the lease expired and the task was given
    -- to someone else) is refused and left alone.
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION rota.complete(p_ids uuid[], p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
                 SET enable_nestloop = off SET jit = off AS $body$%s$body$$function$,
        format(v_completing, 'SELECT s.task_id FROM stored s', 'SELECT s.task_id FROM stored s'));
END
$make$;

-- Hands back claimed tasks whose name the worker's app does not know, for a
-- worker that knows it: each runs again p_delay seconds later with no attempt
-- used, until it has been unknown for p_grace seconds; then it is dead with
-- p_reason. Stale tokens are refused.
CREATE OR REPLACE FUNCTION rota.defer_unknown(
    p_ids uuid[], p_attempts integer[], p_delay double precision, p_grace double precision,
    p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- by these tokens.
CREATE OR REPLACE FUNCTION rota.extend_leases(p_ids uuid[], p_attempts integer[],
                                              p_lease_seconds double precision)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');
BEGIN
    RETURN QUERY
    UPDATE rota.running r
    SET lease_expires_at = now() + make_interval(secs => p_lease_seconds)
    FROM unnest(p_ids, p_attempts) AS x(id, attempt)
    WHERE r.task_id = x.id AND r.attempt = x.attempt
      -- A lease that passed is not revived (rota.take_running).
      AND r.lease_expires_at > now()
      AND (v_worker IS NULL OR r.worker = v_worker)
    RETURNING r.task_id;
END
$$;
