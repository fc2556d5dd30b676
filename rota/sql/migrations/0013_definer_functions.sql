-- Least privilege: what producers, loaders and workers change, they change
-- through these functions (SECURITY DEFINER, fixed search_path), so that their
-- roles need no UPDATE or DELETE on the tables (rota/sql/roles.sql grants).

-- Claims up to `limit` ready tasks of the given queues in fair order, in one
-- statement. Tenants at their concurrency limit or out of rate tokens are
-- skipped by the scan; the admission below is the race-proof check. Tenants
-- without limits (most) skip the admission's locking, counting and ranking.
-- SECURITY DEFINER: a worker's role claims through it, holding no direct
-- UPDATE or DELETE on the tables.
CREATE FUNCTION rota.claim(p_queues text[], p_limit integer, p_worker text,
                           p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH limits AS MATERIALIZED (
        -- Every limited tenant (the partial index holds only those), and those
        -- that cannot take a task now.
        SELECT coalesce(array_agg(t.id), '{}') AS limited,
               coalesce(array_agg(t.id) FILTER (
                   WHERE t.running >= t.concurrency_limit
                      OR t.rate_limit IS NOT NULL
                         AND least(t.rate_burst,
                                   t.tokens + t.rate_limit * extract(epoch FROM now() - t.refilled_at)) < 1),
                   '{}') AS blocked
        FROM rota.tenants t
        WHERE t.limited
    ), candidates AS MATERIALIZED (
        SELECT c.*, q.name AS queue
        FROM rota.queues q
        CROSS JOIN LATERAL (
            SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id
            FROM rota.ready r
            -- `+ 0` hides the column's statistics from this filter: when one
            -- tenant holds the whole backlog they make the planner expect no row
            -- to pass it, and it then sorts a seq scan of ready on every claim.
            WHERE r.queue_id = q.id AND r.tenant_id + 0 <> ALL ((SELECT blocked FROM limits)::integer[])
            ORDER BY r.vtime, r.tenant_id, r.seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) c
        WHERE q.name = ANY (p_queues)
        ORDER BY c.vtime, c.tenant_id, c.seq
        LIMIT p_limit
    ), limited AS MATERIALIZED (
        -- The candidates' limited tenants, locked in id order, as every writer of
        -- tenant counters locks them; FOR UPDATE reads the latest committed
        -- counters, so racing claims cannot both take the last free slot.
        SELECT t.id,
               t.concurrency_limit - t.running AS free_slots,
               -- least() skips NULLs: without a rate limit the tokens must stay NULL.
               CASE WHEN t.rate_limit IS NOT NULL
                    THEN least(t.rate_burst,
                               t.tokens + t.rate_limit * extract(epoch FROM now() - t.refilled_at))
               END AS tokens
        FROM rota.tenants t
        WHERE t.limited AND t.id = ANY (ARRAY(
            SELECT DISTINCT c.tenant_id FROM candidates c
            WHERE c.tenant_id = ANY ((SELECT limited FROM limits)::integer[])))
        ORDER BY t.id
        FOR UPDATE
    ), admitted AS MATERIALIZED (
        -- Unlimited tenants' candidates as they are; a limited tenant's, in its
        -- order, as many as it has free slots and tokens.
        SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, false AS counted
        FROM candidates c
        WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
        UNION ALL
        SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id,
               l.free_slots IS NOT NULL
        FROM (
            SELECT candidates.*,
                   row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
            FROM candidates
            WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
        ) c
        JOIN limited l ON l.id = c.tenant_id
        WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))
    ), charged AS (
        UPDATE rota.tenants t
        SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
            tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
            refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
        FROM (SELECT tenant_id, count(*) AS n FROM admitted GROUP BY tenant_id) a
        JOIN limited l ON l.id = a.tenant_id
        -- The ANY keeps the planner on the key, even with a plan made on few tenants.
        WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))
    ), taken AS (
        DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM admitted))
    ), claimed AS MATERIALIZED (
        SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.counted,
               t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
               now() + make_interval(secs => p_lease_seconds) AS lease_expires_at
        FROM rota.tasks t
        JOIN admitted a ON a.task_id = t.id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM admitted))
    ), leased AS (
        INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                  lease_expires_at, counted)
        SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted
        FROM claimed
    )
    SELECT c.task_id AS id, c.name, c.payload::text, c.queue,
           -- Looked up only for tasks loaded before the name was copied (0011).
           coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
               AS tenant,
           c.attempt,
           c.max_attempts, c.lease_expires_at, c.enqueued_at
    FROM claimed c
    ORDER BY c.vtime, c.tenant_id, c.seq;
END
$$;

-- Heartbeat: extends the leases; returns the ids still held by these tokens.
CREATE FUNCTION rota.extend_leases(p_ids uuid[], p_attempts integer[],
                                   p_lease_seconds double precision)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    UPDATE rota.running r
    SET lease_expires_at = now() + make_interval(secs => p_lease_seconds)
    FROM unnest(p_ids, p_attempts) AS x(id, attempt)
    WHERE r.task_id = x.id AND r.attempt = x.attempt
    RETURNING r.task_id;
END
$$;

-- Due scheduled tasks (ETA reached, retry backoff over), back to pending; they
-- get their fair place in line from rota.core.make_ready.
CREATE FUNCTION rota.take_due(p_limit integer)
RETURNS TABLE (id uuid, seq bigint, queue_id integer, tenant_id integer,
               cost double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        DELETE FROM rota.scheduled
        WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM rota.scheduled WHERE run_at <= now()
            ORDER BY run_at LIMIT p_limit FOR UPDATE SKIP LOCKED))
        RETURNING task_id
    ), promoted AS (
        UPDATE rota.tasks t SET status = 'pending'
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM due)) AND t.status = 'scheduled'
        RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost
    )
    SELECT p.id, p.seq, p.queue_id, p.tenant_id, p.cost FROM promoted p ORDER BY p.seq;
END
$$;

-- A worker's heartbeat: false once it was declared dead (it must stop).
CREATE FUNCTION rota.worker_heartbeat(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE rota.workers SET heartbeat_at = now() WHERE id = p_id AND stopped_at IS NULL;
    RETURN FOUND;
END
$$;

CREATE FUNCTION rota.stop_worker(p_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE rota.workers SET stopped_at = now() WHERE id = p_id
$$;

-- Marks workers dead; returns their claimed tasks' ids, for requeueing.
CREATE FUNCTION rota.reap_workers(p_ids text[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH dead AS (
        UPDATE rota.workers SET stopped_at = now()
        WHERE id = ANY (p_ids) AND stopped_at IS NULL
        RETURNING id
    )
    SELECT r.task_id FROM rota.running r WHERE r.worker = ANY (ARRAY(SELECT id FROM dead));
END
$$;

-- Functions that producers, loaders and workers call run as the schema's
-- owner, with a fixed search_path: those roles hold no UPDATE or DELETE.
ALTER FUNCTION rota.name_ids(text[], text[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.fair_starts(integer[], integer[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.save_fair_tags(integer[], integer[], double precision[], integer[],
                                   double precision[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.complete(uuid[], integer[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.fail(uuid[], integer[], text[], timestamptz[], boolean[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.requeue(uuid[], integer[], boolean, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.requeue_expired()
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.defer_unknown(uuid[], integer[], double precision, double precision, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Functions run by anyone with EXECUTE, which PUBLIC has by default: only the
-- roles of `rota migrate --roles` (rota/sql/roles.sql) get it.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
-- The virtual clock is read by the producers' backlog view too.
ALTER FUNCTION rota.vclock(integer) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
