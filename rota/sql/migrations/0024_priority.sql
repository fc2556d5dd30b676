-- rota 0024: priority within a tenant (docs/architecture.md, "Fairness").
-- A task's priority, 0 (normal) to 9, is stored with it and carried into
-- line (rota.ready) and out to running (a requeue puts it back with its place
-- and priority). A claim picks its slots as before; a tenant's waiting tasks
-- of a higher priority than a slot's task take that slot, the task they
-- displace taking their place in line, so the tenant's places, and its
-- share, are unchanged. The partial index ready_urgent holds only tasks
-- above 0: tasks at 0 cost the load and the claim nothing more.

ALTER TABLE rota.tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD CONSTRAINT priority_bounded CHECK (priority >= 0 AND priority <= 9) NOT VALID;
ALTER TABLE rota.ready ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE rota.running ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX ready_urgent ON rota.ready (queue_id, tenant_id, priority DESC, vtime, seq)
    WHERE priority > 0;

CREATE OR REPLACE FUNCTION rota.requeue(p_ids uuid[], p_attempts integer[], p_consume boolean, p_reason text)
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
        -- ready_urgent; looked for only when the queues hold an urgent task
        -- at all (one probe of that index), so claims without any cost what
        -- they cost before.
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
        WHERE EXISTS (SELECT FROM rota.ready x
                      WHERE x.queue_id = ANY (ARRAY(SELECT DISTINCT a.queue_id FROM admitted a))
                        AND x.priority > 0)
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
        DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM picked))
    ), moved AS (
        UPDATE rota.ready r SET vtime = s.vtime
        FROM swaps s
        WHERE r.ctid = ANY (ARRAY(SELECT slot_row FROM swaps)) AND r.ctid = s.slot_row
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
END
$$;

DROP FUNCTION rota.take_due(integer);
CREATE FUNCTION rota.take_due(p_limit integer)
RETURNS TABLE (id uuid, seq bigint, queue_id integer, tenant_id integer,
               cost double precision, priority smallint)
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
        RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.priority
    )
    SELECT p.id, p.seq, p.queue_id, p.tenant_id, p.cost, p.priority FROM promoted p
    ORDER BY p.seq;
END
$$;

DROP FUNCTION rota.enter_line(uuid[], bigint[], integer[], integer[], double precision[]);
CREATE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                p_tenant_ids integer[], p_costs double precision[],
                                p_priorities smallint[])
RETURNS void
-- Custom plans: the arrays' sizes decide the joins (a generic plan, which
-- rota's sessions otherwise force, guesses them).
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT q, t FROM unnest(p_queue_ids, p_tenant_ids) AS x(q, t)) pairs;
    -- fair_starts locks the queues (in id order) until the transaction ends.
    WITH starts AS MATERIALIZED (
        SELECT * FROM rota.fair_starts(v_pair_queues, v_pair_tenants)
    ), placed AS MATERIALIZED (
        SELECT x.queue_id, x.tenant_id, x.seq, x.id, x.priority,
               s.start + sum(x.cost / s.weight) OVER w - x.cost / s.weight AS vtime,
               s.start + sum(x.cost / s.weight) OVER w AS finish
        FROM unnest(p_ids, p_seqs, p_queue_ids, p_tenant_ids, p_costs, p_priorities)
             AS x(id, seq, queue_id, tenant_id, cost, priority)
        JOIN starts s ON s.queue_id = x.queue_id AND s.tenant_id = x.tenant_id
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq
                     ROWS UNBOUNDED PRECEDING)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT queue_id, vtime, tenant_id, seq, id, priority FROM placed
    ), tags AS (
        INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
        SELECT queue_id, tenant_id, max(finish) FROM placed GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = excluded.finish_tag
    )
    UPDATE rota.queues q SET max_start = greatest(q.max_start, m.s)
    FROM (SELECT queue_id, max(vtime) AS s FROM placed GROUP BY 1) m
    WHERE q.id = m.queue_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(p_queue_ids)));
END
$$;

CREATE OR REPLACE FUNCTION rota.promote_due(p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids uuid[];
    v_seqs bigint[];
    v_queues integer[];
    v_tenants integer[];
    v_costs double precision[];
    v_priorities smallint[];
BEGIN
    SELECT array_agg(d.id ORDER BY d.seq), array_agg(d.seq ORDER BY d.seq),
           array_agg(d.queue_id ORDER BY d.seq), array_agg(d.tenant_id ORDER BY d.seq),
           array_agg(d.cost ORDER BY d.seq), array_agg(d.priority ORDER BY d.seq)
    INTO v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities
    FROM rota.take_due(least(greatest(p_limit, 1), 100000)) d;
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities);
    RETURN coalesce(cardinality(v_ids), 0);
END
$$;

CREATE OR REPLACE FUNCTION rota.enter_line_of(p_ids uuid[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
    v_after bigint;
    v_last bigint;
    v_ids uuid[];
    v_seqs bigint[];
    v_queues integer[];
    v_tenants integer[];
    v_costs double precision[];
    v_priorities smallint[];
BEGIN
    SELECT l.seq INTO v_after FROM rota.lined l WHERE l.xact = pg_current_xact_id();
    WITH fresh AS MATERIALIZED (
        SELECT t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.status, t.eta, t.priority
        FROM rota.tasks t
        WHERE t.id = ANY (p_ids) AND t.loaded_at = now() AND t.attempts = 0
          AND t.status IN ('pending', 'scheduled')
          AND (v_after IS NULL OR t.seq > v_after)
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT coalesce(f.eta, now()), f.id FROM fresh f WHERE f.status = 'scheduled'
    )
    SELECT max(f.seq),
           array_agg(f.id ORDER BY f.seq) FILTER (WHERE f.status = 'pending'),
           array_agg(f.seq ORDER BY f.seq) FILTER (WHERE f.status = 'pending'),
           array_agg(f.queue_id ORDER BY f.seq) FILTER (WHERE f.status = 'pending'),
           array_agg(f.tenant_id ORDER BY f.seq) FILTER (WHERE f.status = 'pending'),
           array_agg(f.cost ORDER BY f.seq) FILTER (WHERE f.status = 'pending'),
           array_agg(f.priority ORDER BY f.seq) FILTER (WHERE f.status = 'pending')
    INTO v_last, v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities
    FROM fresh f;
    IF v_last IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO rota.lined AS l (xact, seq) VALUES (pg_current_xact_id(), v_last)
    ON CONFLICT (xact) DO UPDATE SET seq = greatest(l.seq, excluded.seq);
    -- Now and then, the rows of transactions that ended go.
    IF random() < 0.01 THEN
        DELETE FROM rota.lined WHERE pg_xact_status(xact) IS DISTINCT FROM 'in progress';
    END IF;
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities);
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
