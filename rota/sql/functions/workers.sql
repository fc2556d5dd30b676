-- Workers (rota/consumer/): the registry and its duties (heartbeats, the
-- reaper), and the functions a worker role calls, each as the schema's owner
-- after checking the worker's secret.

-- A worker's heartbeat: false once it was declared dead (it must stop).
CREATE OR REPLACE FUNCTION rota.worker_heartbeat(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE rota.workers SET heartbeat_at = now() WHERE id = p_id AND stopped_at IS NULL;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION rota.stop_worker(p_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE rota.workers SET stopped_at = now() WHERE id = p_id
$$;

-- Declares silent workers dead; returns the ids of their tasks requeued. Only
-- a worker silent for two of its own heartbeats can be declared dead, whoever
-- asks: a live worker never is. One silent may only be cut off and still
-- running what it holds: each task goes back in line once its lease passed
-- (here, or by rota.requeue_expired), never sooner.
CREATE OR REPLACE FUNCTION rota.reap_workers(p_ids text[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tasks uuid[];
BEGIN
    WITH dead AS (
        UPDATE rota.workers SET stopped_at = now(), declared_dead = true
        WHERE id = ANY (p_ids) AND stopped_at IS NULL
          AND heartbeat_at < now() - make_interval(secs => 2 * coalesce(heartbeat_seconds, 0))
        RETURNING id
    )
    SELECT array_agg(r.task_id) INTO v_tasks
    FROM rota.running r
    WHERE r.worker = ANY (ARRAY(SELECT id FROM dead)) AND r.lease_expires_at < now();
    IF v_tasks IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM rota.requeue(
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true, 'worker died');
END
$$;

-- Declares dead workers whose process is gone (its pid, on the host that
-- asks) and requeues all their tasks at once: nothing runs them any more.
-- The same two heartbeats of silence are needed first.
CREATE OR REPLACE FUNCTION rota.reap_gone_workers(p_ids text[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tasks uuid[];
BEGIN
    WITH dead AS (
        UPDATE rota.workers SET stopped_at = now()
        WHERE id = ANY (p_ids) AND stopped_at IS NULL
          AND heartbeat_at < now() - make_interval(secs => 2 * coalesce(heartbeat_seconds, 0))
        RETURNING id
    )
    SELECT array_agg(r.task_id) INTO v_tasks
    FROM rota.running r WHERE r.worker = ANY (ARRAY(SELECT id FROM dead));
    IF v_tasks IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM rota.requeue(
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true,
        'its worker''s process is gone');
END
$$;

-- Claims still held by workers that stopped more than p_after ago (a worker
-- that died during its shutdown). Returns their task ids, to requeue. Those
-- of a worker declared dead for its silence are its leases' to free.
CREATE OR REPLACE FUNCTION rota.stopped_workers_claims(p_after interval) RETURNS SETOF uuid
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.task_id FROM rota.running r
    JOIN rota.workers w ON w.id = r.worker
    WHERE w.stopped_at < now() - p_after AND NOT w.declared_dead
$$;

-- Checks a worker's secret, and makes the rest of the transaction act as that
-- worker: rota.take_running and rota.extend_leases then touch only its tasks.
CREATE OR REPLACE FUNCTION rota.check_worker(p_worker text, p_secret bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_secret IS NULL OR NOT EXISTS (
        SELECT FROM rota.workers w WHERE w.id = p_worker AND w.secret_hash = sha256(p_secret)
    ) THEN
        RAISE EXCEPTION 'worker % is not registered with this secret', p_worker
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('rota.acting_worker', p_worker, true);
END
$$;

-- What a worker role calls: each checks the worker's secret first.

-- Registers a worker: its secret's hash, and how often it beats (it may be
-- declared dead only after two beats of silence).
CREATE OR REPLACE FUNCTION rota.register_worker(p_id text, p_host text, p_pid integer,
                                                p_queues text[], p_concurrency integer,
                                                p_secret bytea,
                                                p_heartbeat_seconds double precision) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO rota.workers (id, host, pid, queues, concurrency, secret_hash, heartbeat_seconds)
    VALUES (p_id, p_host, p_pid, p_queues, p_concurrency, sha256(p_secret),
            least(greatest(p_heartbeat_seconds, 0), 3600))
    -- Again by the same worker (its reply lost with the server): the same row.
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
    WHERE rota.workers.secret_hash IS NOT DISTINCT FROM excluded.secret_hash
$$;

CREATE OR REPLACE FUNCTION rota.worker_claim(p_worker text, p_secret bytea, p_queues text[],
                                             p_limit integer,
                                             p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds);
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_complete(p_worker text, p_secret bytea, p_ids uuid[],
                                                p_attempts integer[],
                                                p_started double precision[] DEFAULT NULL,
                                                p_ran double precision[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete(p_ids, p_attempts, p_started, p_ran);
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_complete_claim(p_worker text, p_secret bytea, p_ids uuid[],
                                                      p_attempts integer[], p_queues text[],
                                                      p_limit integer,
                                                      p_lease_seconds double precision,
                                                      p_started double precision[] DEFAULT NULL,
                                                      p_ran double precision[] DEFAULT NULL)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete_claim(p_ids, p_attempts, p_queues, p_limit,
                                                   p_worker, p_lease_seconds, p_started, p_ran);
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_fail(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_errors text[],
    p_retry_at timestamptz[], p_final boolean[], p_tracebacks text[]
) RETURNS TABLE (id uuid, status rota.task_status, run_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.fail(p_ids, p_attempts, p_errors, p_retry_at, p_final,
                                         p_tracebacks);
END
$$;

-- Hands back unstarted tasks (no attempt used).
CREATE OR REPLACE FUNCTION rota.worker_release(p_worker text, p_secret bytea, p_ids uuid[],
                                               p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.requeue(p_ids, p_attempts, false, NULL);
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_defer_unknown(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_delay double precision,
    p_grace double precision, p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.defer_unknown(p_ids, p_attempts, p_delay, p_grace, p_reason);
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_extend_leases(p_worker text, p_secret bytea,
                                                     p_ids uuid[], p_attempts integer[],
                                                     p_lease_seconds double precision,
                                                     p_started double precision[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.extend_leases(p_ids, p_attempts, p_lease_seconds, p_started);
END
$$;

-- The tasks a worker holds (to find what a claim it could not read took).
CREATE OR REPLACE FUNCTION rota.worker_claims(p_worker text, p_secret bytea)
RETURNS TABLE (task_id uuid, attempt integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT r.task_id, r.attempt FROM rota.running r WHERE r.worker = p_worker;
END
$$;

-- A worker's heartbeat: false once it was declared dead (it must stop).
CREATE OR REPLACE FUNCTION rota.worker_beat(p_worker text, p_secret bytea) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET heartbeat_at = now() WHERE id = p_worker AND stopped_at IS NULL;
    RETURN FOUND;
END
$$;

-- A worker declared dead while it was only cut off (a partition longer than
-- ROTA_WORKER_DEAD_AFTER_SECONDS) comes back under its own name: what it
-- holds is still its while the leases last, and its reports of tasks whose
-- leases passed are refused. False when its row is gone.
CREATE OR REPLACE FUNCTION rota.worker_rejoin(p_worker text, p_secret bytea) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET stopped_at = NULL, declared_dead = false, heartbeat_at = now()
    WHERE id = p_worker;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_stop(p_worker text, p_secret bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET stopped_at = now() WHERE id = p_worker;
END
$$;

-- Requeues claims still held by workers that stopped more than p_after ago
-- (the attempt counts); returns the ids requeued. A worker declared dead for
-- its silence may be running them: its leases free them (requeue_expired).
CREATE OR REPLACE FUNCTION rota.reap_stopped_claims(p_after interval) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tasks uuid[];
BEGIN
    SELECT array_agg(r.task_id) INTO v_tasks
    FROM rota.running r JOIN rota.workers w ON w.id = r.worker
    WHERE w.stopped_at < now() - greatest(p_after, interval '1 second')
      AND NOT w.declared_dead;
    IF v_tasks IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM rota.requeue(
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true,
        'its worker stopped holding it');
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_complete_keeping(p_worker text, p_secret bytea, p_ids uuid[],
                                                        p_attempts integer[], p_values jsonb[],
                                                        p_refused text[], p_ttls double precision[],
                                                        p_started double precision[] DEFAULT NULL,
                                                        p_ran double precision[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT c.task_id FROM rota.complete_keeping(p_ids, p_attempts, p_values,
                                                             p_refused, p_ttls, p_started,
                                                             p_ran) c;
END
$$;

CREATE OR REPLACE FUNCTION rota.worker_complete_keeping_claim(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_values jsonb[],
    p_refused text[], p_ttls double precision[], p_queues text[], p_limit integer,
    p_lease_seconds double precision, p_started double precision[] DEFAULT NULL,
    p_ran double precision[] DEFAULT NULL
)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete_keeping_claim(p_ids, p_attempts, p_values,
                                                           p_refused, p_ttls, p_queues, p_limit,
                                                           p_worker, p_lease_seconds,
                                                           p_started, p_ran);
END
$$;

-- Records measured run times (a worker's, each heartbeat): per queue and
-- tenant, runs and their seconds. In queues charged by time they move the
-- pair's and the queue's seconds per run (a mean over about the last ten
-- runs), which the next loads' places are costed with. A pair measured for
-- the first time, or whose mean more than doubled or halved, has its waiting
-- tasks placed again at the new cost (from its first one on, in their
-- order): a backlog loaded before it was measured does not keep a wrong
-- share. Rows are locked in key order, as loads lock them.
CREATE OR REPLACE FUNCTION rota.record_run_times(p_queues text[], p_tenants text[],
                                                 p_runs integer[], p_seconds double precision[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queues integer[];
    v_tenants integer[];
    v_steps double precision[];
BEGIN
    WITH given AS MATERIALIZED (
        SELECT q.id AS queue_id, t.id AS tenant_id, t.weight, x.runs, x.seconds
        FROM unnest(p_queues, p_tenants, p_runs, p_seconds) AS x(queue, tenant, runs, seconds)
        JOIN rota.queues q ON q.name = x.queue AND q.charge_time
        JOIN rota.tenants t ON t.name = x.tenant
        WHERE x.runs > 0 AND x.seconds >= 0
    ), locked AS MATERIALIZED (
        SELECT tq.queue_id, tq.tenant_id, tq.run_seconds AS before FROM rota.tenant_queues tq
        JOIN given g ON g.queue_id = tq.queue_id AND g.tenant_id = tq.tenant_id
        ORDER BY tq.queue_id, tq.tenant_id FOR UPDATE OF tq
    ), pairs AS (
        UPDATE rota.tenant_queues tq
        SET run_seconds = CASE WHEN tq.run_seconds IS NULL THEN g.seconds / g.runs
                               ELSE tq.run_seconds
                                    + (g.seconds / g.runs - tq.run_seconds) * g.runs / (g.runs + 10.0)
                          END
        FROM given g JOIN locked l ON l.queue_id = g.queue_id AND l.tenant_id = g.tenant_id
        WHERE tq.queue_id = g.queue_id AND tq.tenant_id = g.tenant_id
        RETURNING tq.queue_id, tq.tenant_id, tq.run_seconds, l.before, g.weight
    ), queues AS (
        UPDATE rota.queues q
        SET run_seconds = CASE WHEN q.run_seconds IS NULL THEN a.seconds / a.runs
                               ELSE q.run_seconds
                                    + (a.seconds / a.runs - q.run_seconds) * a.runs / (a.runs + 10.0)
                          END
        FROM (SELECT g.queue_id, sum(g.runs) AS runs, sum(g.seconds) AS seconds
              FROM given g GROUP BY g.queue_id) a
        WHERE q.id = a.queue_id
    )
    SELECT array_agg(p.queue_id), array_agg(p.tenant_id),
           array_agg(greatest(p.run_seconds, 1e-6) / p.weight)
    INTO v_queues, v_tenants, v_steps
    FROM pairs p
    WHERE p.before IS NULL OR p.run_seconds > 2 * p.before OR p.run_seconds < p.before / 2;
    IF v_queues IS NULL THEN
        RETURN;
    END IF;
    -- Placed again one run's cost apart (a declared cost of 1 each).
    WITH moved AS (
        SELECT * FROM unnest(v_queues, v_tenants, v_steps) AS m(queue_id, tenant_id, step)
    ), ordered AS MATERIALIZED (
        SELECT r.ctid AS row_id, r.queue_id, r.tenant_id, m.step,
               first_value(r.vtime) OVER w AS first, row_number() OVER w - 1 AS n
        FROM rota.ready r JOIN moved m ON m.queue_id = r.queue_id AND m.tenant_id = r.tenant_id
        WINDOW w AS (PARTITION BY r.queue_id, r.tenant_id ORDER BY r.vtime, r.seq)
    ), placed AS (
        UPDATE rota.ready r SET vtime = o.first + o.n * o.step
        FROM ordered o WHERE r.ctid = o.row_id
        RETURNING r.queue_id, r.tenant_id, r.vtime
    )
    UPDATE rota.tenant_queues tq SET finish_tag = p.last + m.step
    FROM (SELECT queue_id, tenant_id, max(vtime) AS last FROM placed GROUP BY 1, 2) p
    JOIN moved m ON m.queue_id = p.queue_id AND m.tenant_id = p.tenant_id
    WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id;
END
$$;
