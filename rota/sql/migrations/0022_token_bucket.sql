-- rota 0022: a tenant's tokens now (the token bucket) in one function,
-- rota.tokens_now, for claims and the read model alike.

-- A tenant's tokens now: its rate limit's bucket, refilled since it was last
-- charged, up to its burst; NULL without a rate limit (least() would skip a
-- NULL, so the CASE keeps it). Plain SQL, so the planner inlines it.
CREATE FUNCTION rota.tokens_now(p_rate double precision, p_burst double precision,
                                p_tokens double precision, p_refilled_at timestamptz)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_rate IS NOT NULL
                THEN least(p_burst, p_tokens + p_rate * extract(epoch FROM now() - p_refilled_at))
           END
$$;

CREATE OR REPLACE FUNCTION rota.claim(p_queues text[], p_limit integer, p_worker text,
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
                   WHERE t.paused
                      OR t.running >= t.concurrency_limit
                      OR rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) < 1),
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
        WHERE q.name = ANY (p_queues) AND NOT q.paused
        ORDER BY c.vtime, c.tenant_id, c.seq
        LIMIT p_limit
    ), limited AS MATERIALIZED (
        -- The candidates' limited tenants, locked in id order, as every writer of
        -- tenant counters locks them; FOR UPDATE reads the latest committed
        -- counters, so racing claims cannot both take the last free slot.
        SELECT t.id,
               t.concurrency_limit - t.running AS free_slots,
               rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) AS tokens
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
           -- Looked up only for tasks stored before the name was copied to them.
           coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
               AS tenant,
           c.attempt,
           c.max_attempts, c.lease_expires_at, c.enqueued_at
    FROM claimed c
    ORDER BY c.vtime, c.tenant_id, c.seq;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
