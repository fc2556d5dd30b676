-- rota 0020: workers prove who they are (a secret given at registration, its
-- hash kept); a worker role claims and reports only as, and for, itself, and
-- its maintenance is bounded: no live worker declared dead, no history
-- younger than rota.limits deleted.

-- A worker proves who it is: it registers with a secret (only its hash is
-- kept), and every call that claims or reports gives the secret back. A
-- worker role can then only claim as, and complete, fail, hand back or
-- extend the tasks of, a worker it registered itself.
ALTER TABLE rota.workers ADD COLUMN secret_hash bytea, ADD COLUMN heartbeat_seconds double precision;

-- Checks a worker's secret, and makes the rest of the transaction act as that
-- worker: rota.take_running and rota.extend_leases then touch only its tasks.
CREATE FUNCTION rota.check_worker(p_worker text, p_secret bytea) RETURNS void
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

CREATE OR REPLACE FUNCTION rota.take_running(p_ids uuid[], p_attempts integer[])
RETURNS SETOF rota.running
LANGUAGE plpgsql SET enable_nestloop = off AS $$
DECLARE
    -- Set by rota.check_worker: a worker takes only what it holds.
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');
BEGIN
    RETURN QUERY
    WITH taken AS MATERIALIZED (
        DELETE FROM rota.running r
        USING unnest(p_ids, p_attempts) AS x(id, attempt)
        -- The ANY keeps the planner on the key however many tasks are running.
        WHERE r.task_id = ANY (p_ids) AND r.task_id = x.id
          AND (x.attempt IS NULL OR r.attempt = x.attempt)
          AND (v_worker IS NULL OR r.worker = v_worker)
        RETURNING r.*
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
    )
    SELECT * FROM taken;
END
$$;

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
      AND (v_worker IS NULL OR r.worker = v_worker)
    RETURNING r.task_id;
END
$$;

-- What a worker role calls: each checks the worker's secret first.
-- Registers a worker: its secret's hash, and how often it beats (it may be
-- declared dead only after two beats of silence).
CREATE FUNCTION rota.register_worker(p_id text, p_host text, p_pid integer, p_queues text[],
                                     p_concurrency integer, p_secret bytea,
                                     p_heartbeat_seconds double precision) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO rota.workers (id, host, pid, queues, concurrency, secret_hash, heartbeat_seconds)
    VALUES (p_id, p_host, p_pid, p_queues, p_concurrency, sha256(p_secret),
            least(greatest(p_heartbeat_seconds, 0), 3600))
$$;

CREATE FUNCTION rota.worker_claim(p_worker text, p_secret bytea, p_queues text[],
                                  p_limit integer, p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds);
END
$$;

CREATE FUNCTION rota.worker_complete(p_worker text, p_secret bytea, p_ids uuid[],
                                     p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete(p_ids, p_attempts);
END
$$;

CREATE FUNCTION rota.worker_fail(
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
CREATE FUNCTION rota.worker_release(p_worker text, p_secret bytea, p_ids uuid[],
                                    p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.requeue(p_ids, p_attempts, false, NULL);
END
$$;

CREATE FUNCTION rota.worker_defer_unknown(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_delay double precision,
    p_grace double precision, p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.defer_unknown(p_ids, p_attempts, p_delay, p_grace, p_reason);
END
$$;

CREATE FUNCTION rota.worker_extend_leases(p_worker text, p_secret bytea, p_ids uuid[],
                                          p_attempts integer[], p_lease_seconds double precision)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.extend_leases(p_ids, p_attempts, p_lease_seconds);
END
$$;

-- The tasks a worker holds (to find what a claim it could not read took).
CREATE FUNCTION rota.worker_claims(p_worker text, p_secret bytea)
RETURNS TABLE (task_id uuid, attempt integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT r.task_id, r.attempt FROM rota.running r WHERE r.worker = p_worker;
END
$$;

-- A worker's heartbeat: false once it was declared dead (it must stop).
CREATE FUNCTION rota.worker_beat(p_worker text, p_secret bytea) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET heartbeat_at = now() WHERE id = p_worker AND stopped_at IS NULL;
    RETURN FOUND;
END
$$;

CREATE FUNCTION rota.worker_stop(p_worker text, p_secret bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET stopped_at = now() WHERE id = p_worker;
END
$$;

-- How far maintenance may go when its caller is not an admin (a worker role,
-- whose task handlers may be hostile): retention deletes no younger history
-- than these, whatever interval it is given. One row; admins change it.
CREATE TABLE rota.limits (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    finished_retention_floor interval NOT NULL DEFAULT '1 day',
    dead_retention_floor interval NOT NULL DEFAULT '7 days',
    worker_retention_floor interval NOT NULL DEFAULT '1 hour'
);
INSERT INTO rota.limits DEFAULT VALUES;

-- Whether the session's login may do anything (no roles made, an admin, the
-- owner, a superuser), or is held to rota.limits.
CREATE FUNCTION rota.caller_is_admin() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'rota_admin')
        OR pg_has_role(session_user, 'rota_admin', 'MEMBER')
        OR pg_has_role(session_user, 'rota_owner', 'MEMBER')
$$;

-- The interval a retention duty may use: the caller's, but for a caller held
-- to rota.limits never below the floor.
CREATE FUNCTION rota.retention(p_asked interval, p_floor interval) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN rota.caller_is_admin() THEN p_asked ELSE greatest(p_asked, p_floor) END
$$;

CREATE OR REPLACE FUNCTION rota.prune_finished(p_older_than interval, p_limit integer)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.finished WHERE task_id = ANY (ARRAY(
            SELECT f.task_id FROM rota.finished f
            WHERE f.finished_at < now() - rota.retention(
                p_older_than, (SELECT l.finished_retention_floor FROM rota.limits l))
            LIMIT p_limit))
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

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
        RETURNING 1
    )
    SELECT count(*) INTO v_count FROM pruned;
    RETURN v_count;
END
$$;

-- Declares workers dead and requeues their tasks (the attempt counts);
-- returns the ids requeued. Only a worker silent for two of its own
-- heartbeats can be declared dead, whoever asks: a live worker never is.
CREATE OR REPLACE FUNCTION rota.reap_workers(p_ids text[]) RETURNS SETOF uuid
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
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true, 'worker died');
END
$$;

-- Requeues claims still held by workers stopped more than p_after ago (the
-- attempt counts); returns the ids requeued.
CREATE FUNCTION rota.reap_stopped_claims(p_after interval) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tasks uuid[];
BEGIN
    SELECT array_agg(r.task_id) INTO v_tasks
    FROM rota.running r JOIN rota.workers w ON w.id = r.worker
    WHERE w.stopped_at < now() - greatest(p_after, interval '1 second');
    IF v_tasks IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM rota.requeue(
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true,
        'its worker stopped holding it');
END
$$;

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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
