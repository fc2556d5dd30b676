-- rota 0026: a claim that swaps a tenant's slot for its urgent task deletes
-- the displaced task's row of rota.ready and inserts it at its new place,
-- instead of updating it in place: a racing claim locking with SKIP LOCKED
-- followed the updated row to its new version, which its row ids did not
-- name, and could claim the task a second time (a unique violation of
-- running's key, the whole claim failing).

CREATE OR REPLACE FUNCTION rota.claim(p_queues text[], p_limit integer, p_worker text,
                           p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    -- Priority (docs/architecture.md, "Fairness") is looked at only when
    -- these queues hold an urgent task at all (one probe of the partial
    -- index ready_urgent): claims without any run the plain query.
    IF NOT EXISTS (SELECT FROM rota.queues q JOIN rota.ready x ON x.queue_id = q.id
                   WHERE q.name = ANY (p_queues) AND x.priority > 0) THEN
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
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
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
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   false AS counted
            FROM candidates c
            WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
            UNION ALL
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
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
            SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority, a.counted,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at
            FROM rota.tasks t
            JOIN admitted a ON a.task_id = t.id
            WHERE t.id = ANY (ARRAY(SELECT task_id FROM admitted))
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority)
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority
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
    ELSE
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
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
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
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   false AS counted
            FROM candidates c
            WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
            UNION ALL
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   l.free_slots IS NOT NULL
            FROM (
                SELECT candidates.*,
                       row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
                FROM candidates
                WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
            ) c
            JOIN limited l ON l.id = c.tenant_id
            WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))
        ), urgent AS MATERIALIZED (
            -- Priority (docs/architecture.md, "Fairness"): the slots are the
            -- admitted ones; a tenant's own waiting tasks of a higher priority
            -- than a slot's task may take it. Per admitted tenant and queue, at
            -- most as many as its slots, best first, from the partial index
            -- ready_urgent.
            SELECT u.row_id, u.queue_id, u.vtime, u.tenant_id, u.seq, u.task_id, u.priority
            FROM (SELECT a.queue_id, a.tenant_id, count(*) AS slots, min(a.priority) AS lowest
                  FROM admitted a GROUP BY a.queue_id, a.tenant_id) s
            CROSS JOIN LATERAL (
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
                FROM rota.ready r
                WHERE r.queue_id = s.queue_id AND r.tenant_id = s.tenant_id
                  AND r.priority > 0 AND r.priority > s.lowest
                  AND r.ctid <> ALL (ARRAY(SELECT a.row_id FROM admitted a))
                ORDER BY r.priority DESC, r.vtime, r.seq
                LIMIT s.slots
                FOR UPDATE SKIP LOCKED
            ) u
        ), ranked AS MATERIALIZED (
            -- A tenant's slots go to its best tasks among its admitted and urgent
            -- ones: highest priority first, then earliest in line.
            SELECT p.*,
                   row_number() OVER (PARTITION BY p.queue_id, p.tenant_id
                                      ORDER BY p.priority DESC, p.vtime, p.seq) AS best,
                   count(*) FILTER (WHERE p.slot) OVER (PARTITION BY p.queue_id, p.tenant_id)
                       AS slots
            FROM (
                SELECT a.row_id, a.queue_id, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority,
                       true AS slot
                FROM admitted a
                WHERE (a.queue_id, a.tenant_id) IN (SELECT u.queue_id, u.tenant_id FROM urgent u)
                UNION ALL
                SELECT u.row_id, u.queue_id, u.vtime, u.tenant_id, u.seq, u.task_id, u.priority, false
                FROM urgent u
            ) p
        ), swaps AS MATERIALIZED (
            -- Each admitted task that lost its slot pairs with an urgent task that
            -- won one, the earliest slot with the best: the urgent task runs in
            -- the slot (and keeps the slot's place while it runs), the other
            -- waits at the urgent task's place. The tenant's places, and so its
            -- share, are unchanged.
            SELECT l.row_id AS slot_row, w.row_id, w.vtime, w.seq, w.task_id, w.priority
            FROM (SELECT r.row_id, r.queue_id, r.tenant_id,
                         row_number() OVER (PARTITION BY r.queue_id, r.tenant_id
                                            ORDER BY r.vtime, r.seq) AS n
                  FROM ranked r WHERE r.slot AND r.best > r.slots) l
            JOIN (SELECT r.*,
                         row_number() OVER (PARTITION BY r.queue_id, r.tenant_id
                                            ORDER BY r.best) AS n
                  FROM ranked r WHERE NOT r.slot AND r.best <= r.slots) w
              ON w.queue_id = l.queue_id AND w.tenant_id = l.tenant_id AND w.n = l.n
        ), picked AS MATERIALIZED (
            -- The tasks claimed: the admitted ones, but in a swapped slot its urgent task.
            SELECT a.row_id, a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority,
                   a.counted
            FROM admitted a
            WHERE a.row_id <> ALL (ARRAY(SELECT s.slot_row FROM swaps s))
            UNION ALL
            SELECT s.row_id, a.queue_id, a.queue, a.vtime, a.tenant_id, s.seq, s.task_id, s.priority,
                   a.counted
            FROM swaps s JOIN admitted a ON a.row_id = s.slot_row
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
            -- The displaced tasks' rows go too, and come back at their new
            -- places (moved): a row of ready is never updated in place, so a
            -- racing claim's SKIP LOCKED skips it rather than following it to
            -- a new version that its row ids (ctid) would not name.
            DELETE FROM rota.ready
            WHERE ctid = ANY (ARRAY(SELECT row_id FROM picked UNION ALL
                                    SELECT slot_row FROM swaps))
        ), moved AS (
            INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
            SELECT a.queue_id, s.vtime, a.tenant_id, a.seq, a.task_id, a.priority
            FROM swaps s JOIN admitted a ON a.row_id = s.slot_row
        ), claimed AS MATERIALIZED (
            SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority, a.counted,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at
            FROM rota.tasks t
            JOIN picked a ON a.task_id = t.id
            WHERE t.id = ANY (ARRAY(SELECT task_id FROM picked))
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority)
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority
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
    END IF;
END
$$;
