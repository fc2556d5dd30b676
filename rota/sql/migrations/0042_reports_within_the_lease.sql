-- rota 0042: a worker's reports and heartbeats count only within its lease.
-- Past it the worker holds nothing, even before maintenance requeues the
-- task: a worker cut off by a silent partition (or frozen) cannot complete,
-- fail, release or extend what it held once it is back. The requeue of
-- passed leases goes without attempt tokens. A worker declared dead while
-- it was only cut off rejoins under its own name.

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
          -- A worker's report (an attempt token) counts only within its
          -- lease: past it the worker holds nothing (the task is requeued
          -- and may run elsewhere), whatever kept it silent.
          AND (x.attempt IS NULL OR (r.attempt = x.attempt AND r.lease_expires_at > now()))
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
        WHERE k.id = ANY (ARRAY(SELECT id FROM keys_locked)) AND k.id = c.key_id
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
      -- A lease that passed is not revived (rota.take_running).
      AND r.lease_expires_at > now()
      AND (v_worker IS NULL OR r.worker = v_worker)
    RETURNING r.task_id;
END
$$;

CREATE OR REPLACE FUNCTION rota.requeue_expired() RETURNS SETOF uuid
LANGUAGE sql AS $$
    SELECT rota.requeue(array_agg(task_id), array_fill(NULL::integer, ARRAY[count(*)::integer]),
                        true, 'lease expired')
    FROM rota.running WHERE lease_expires_at < now()
$$;

-- CREATE OR REPLACE resets what ALTER FUNCTION set.
ALTER FUNCTION rota.requeue_expired()
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- A worker declared dead while it was only cut off (a partition longer than
-- ROTA_WORKER_DEAD_AFTER_SECONDS) comes back under its own name: what it held
-- went back in line when it was declared dead, and its reports of those
-- tasks are refused (their leases passed). False when its row is gone.
CREATE FUNCTION rota.worker_rejoin(p_worker text, p_secret bytea) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET stopped_at = NULL, heartbeat_at = now() WHERE id = p_worker;
    RETURN FOUND;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
