-- rota 0041: limits on keys other than the tenant. A task may name a key of a
-- limit (`stripe`, or `reports/acme:render` for a limit per value); the
-- limit's concurrency and rate hold for each key over every tenant, checked
-- at claim as a tenant's are. Tasks whose key has no room are parked out of
-- line (rota.parked), so that claims do not step over them again and again,
-- and go back to their places once it has room (rota.unpark).

ALTER TABLE rota.tasks ADD COLUMN limit_key text,
    ADD CONSTRAINT limit_key_rule
        CHECK (limit_key ~ '^[a-z][a-z0-9_.-]{0,62}(/[^[:cntrl:]]{1,200})?$') NOT VALID;
-- The key (rota.keys) whose running counter includes this task, if any.
ALTER TABLE rota.running ADD COLUMN key_id integer;
-- Holds tasks whose key's limit exists: only these queues' claims check
-- limits on keys (rota.key_admit).
ALTER TABLE rota.queues ADD COLUMN key_limited boolean NOT NULL DEFAULT false;

-- Limits on keys other than the tenant (docs/howto/limits.md): a task names a
-- key of a limit (tasks.limit_key: `stripe`, or `reports/acme:render` for a
-- limit per value); the limit's concurrency and rate hold for each key, over
-- every tenant. Declared by the app's workers (rota.declare_limits) or set
-- by an operator (rota.set_limit).
CREATE TABLE rota.key_limits (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CONSTRAINT limit_name_rule CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    concurrency_limit integer
        CONSTRAINT limit_concurrency_bounded CHECK (concurrency_limit BETWEEN 0 AND 1000000),
    rate_limit double precision CONSTRAINT limit_rate_bounded CHECK (rate_limit > 0 AND rate_limit <= 1e6),
    rate_burst double precision NOT NULL DEFAULT 1
        CONSTRAINT limit_burst_bounded CHECK (rate_burst >= 1 AND rate_burst <= 1e9),
    -- Set in code (the workers' declaration keeps it as declared), or by an
    -- operator (kept until changed).
    declared boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per key that some loaded task names while its limit exists: the
-- key's counters. Made by the load (rota.tasks_enter_line) and by
-- rota.set_limit for the tasks already loaded.
CREATE TABLE rota.keys (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    limit_id integer NOT NULL,
    -- Claimed-and-unfinished tasks, kept while the limit has a concurrency.
    running integer NOT NULL DEFAULT 0,
    -- Token bucket of the limit's rate.
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    -- Tasks set aside (rota.parked), at least: a claim that parks counts
    -- them; rota.unpark takes them back when the key has room.
    parked integer NOT NULL DEFAULT 0
);
CREATE INDEX keys_of_limit ON rota.keys (limit_id);
CREATE INDEX keys_parked ON rota.keys (id) WHERE parked > 0;

-- Tasks whose key had no room when a claim met them: out of line, so that
-- claims do not step over them again and again, and back in line at their
-- own places (rota.unpark) once their key has room.
CREATE TABLE rota.parked (
    key_id integer NOT NULL,
    queue_id integer NOT NULL,
    vtime double precision NOT NULL,
    tenant_id integer NOT NULL,
    seq bigint NOT NULL,
    task_id uuid NOT NULL PRIMARY KEY,
    priority smallint NOT NULL DEFAULT 0
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
CREATE INDEX parked_order ON rota.parked (key_id, vtime, tenant_id, seq);

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

CREATE OR REPLACE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key: a join on
    -- a function's result is estimated at 1000 rows and turns into a seq scan.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT r.task_id, r.queue_id, r.tenant_id, r.attempt, r.claimed_at, r.counted, r.key_id
        FROM rota.take_running(p_ids, p_attempts) r
    ), gone AS (
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT d.task_id FROM done d))
        RETURNING t.id, t.enqueued_at, t.max_attempts, t.cost
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                                   max_attempts, cost)
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at,
               g.max_attempts, g.cost
        FROM done d JOIN gone g ON g.id = d.task_id
        RETURNING task_id
    ), released AS (
        -- The joins whose last member this was: due now (still waiting, not
        -- dead or cancelled meanwhile).
        -- The countdown drives the statement (a function scan), never a
        -- subquery that the plan may skip; it runs only while some join
        -- waits (one probe of joins_waiting otherwise).
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now(), j.id
        FROM (SELECT WHERE EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)) gate,
             LATERAL rota.count_down_joins(ARRAY(SELECT task_id FROM done)) AS j(id)
        WHERE (SELECT t.status FROM rota.tasks t WHERE t.id = j.id) = 'scheduled'
    )
    SELECT s.task_id, d.counted OR d.key_id IS NOT NULL
    FROM stored s JOIN done d ON d.task_id = s.task_id;
END
$$;

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
        ), key_fit AS MATERIALIZED (
            -- Limits on keys (rota.key_admit), only while some limit exists:
            -- the function, its tables and their locks are not reached otherwise.
            SELECT f.*
            FROM (SELECT WHERE EXISTS (SELECT FROM rota.queues q
                                       WHERE q.name = ANY (p_queues) AND q.key_limited)
                           AND (SELECT count(*) FROM limited) >= 0) gate,
                 LATERAL rota.key_admit(
                     ARRAY(SELECT p.task_id FROM admitted p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.queue_id FROM admitted p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.vtime FROM admitted p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.tenant_id FROM admitted p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.seq FROM admitted p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.priority FROM admitted p ORDER BY p.vtime, p.tenant_id, p.seq)) f
        ), final AS MATERIALIZED (
            SELECT p.*, f.key_id
            FROM admitted p LEFT JOIN key_fit f ON f.task_id = p.task_id
            -- The gate makes key_fit run even when nothing was admitted: it
            -- brings back parked tasks whose key has room.
            WHERE f.fits IS NOT false AND (SELECT count(*) FROM key_fit) >= 0
        ), charged AS (
            UPDATE rota.tenants t
            SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
                tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
                refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
            FROM (SELECT tenant_id, count(*) AS n FROM final GROUP BY tenant_id) a
            JOIN limited l ON l.id = a.tenant_id
            -- The ANY keeps the planner on the key, even with a plan made on few tenants.
            WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))
        ), taken AS (
            -- Parked ones too: they leave the line.
            DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM admitted))
        ), claimed AS MATERIALIZED (
            SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority, a.counted,
                   a.key_id,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at
            FROM rota.tasks t
            JOIN final a ON a.task_id = t.id
            WHERE t.id = ANY (ARRAY(SELECT task_id FROM final))
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority, key_id)
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority, key_id
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
        ), key_fit AS MATERIALIZED (
            -- Limits on keys (rota.key_admit), only while some limit exists:
            -- the function, its tables and their locks are not reached otherwise.
            SELECT f.*
            FROM (SELECT WHERE EXISTS (SELECT FROM rota.queues q
                                       WHERE q.name = ANY (p_queues) AND q.key_limited)
                           AND (SELECT count(*) FROM limited) >= 0) gate,
                 LATERAL rota.key_admit(
                     ARRAY(SELECT p.task_id FROM picked p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.queue_id FROM picked p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.vtime FROM picked p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.tenant_id FROM picked p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.seq FROM picked p ORDER BY p.vtime, p.tenant_id, p.seq),
                     ARRAY(SELECT p.priority FROM picked p ORDER BY p.vtime, p.tenant_id, p.seq)) f
        ), final AS MATERIALIZED (
            SELECT p.*, f.key_id
            FROM picked p LEFT JOIN key_fit f ON f.task_id = p.task_id
            -- The gate makes key_fit run even when nothing was admitted: it
            -- brings back parked tasks whose key has room.
            WHERE f.fits IS NOT false AND (SELECT count(*) FROM key_fit) >= 0
        ), charged AS (
            UPDATE rota.tenants t
            SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
                tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
                refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
            FROM (SELECT tenant_id, count(*) AS n FROM final GROUP BY tenant_id) a
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
                   a.key_id,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at
            FROM rota.tasks t
            JOIN final a ON a.task_id = t.id
            WHERE t.id = ANY (ARRAY(SELECT task_id FROM final))
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority, key_id)
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority, key_id
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

CREATE OR REPLACE FUNCTION rota.tasks_enter_line() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
    v_ran uuid[];
BEGIN
    -- The keys their limits count (only while some limit exists).
    IF EXISTS (SELECT FROM rota.key_limits) THEN
        PERFORM rota.make_keys(ARRAY(SELECT DISTINCT f.limit_key FROM loaded f
                                     WHERE f.limit_key IS NOT NULL),
                               ARRAY(SELECT DISTINCT f.queue_id FROM loaded f
                                     WHERE f.limit_key IS NOT NULL));
    END IF;
    -- A batch loaded again brings back no task that has run. The load looked
    -- before inserting (which keeps its count right); a task that finished
    -- meanwhile, while the insert waited on its row's deletion, is seen here.
    v_ran := ARRAY(SELECT f.task_id FROM rota.finished f
                   WHERE f.task_id = ANY (ARRAY(SELECT l.id FROM loaded l)));
    IF v_ran <> '{}' THEN
        -- Rare: those rows go, and the rest go in line through
        -- rota.enter_line, which leaves the statements below (and their
        -- cached plans) as every other load runs them.
        DELETE FROM rota.tasks WHERE id = ANY (v_ran);
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT coalesce(f.eta, now()), f.id FROM loaded f
        WHERE f.attempts = 0 AND f.status = 'scheduled' AND f.id <> ALL (v_ran);
        PERFORM rota.enter_line(array_agg(f.id ORDER BY f.seq), array_agg(f.seq ORDER BY f.seq),
                                array_agg(f.queue_id ORDER BY f.seq),
                                array_agg(f.tenant_id ORDER BY f.seq),
                                array_agg(f.cost ORDER BY f.seq),
                                array_agg(f.priority ORDER BY f.seq))
        FROM loaded f
        WHERE f.attempts = 0 AND f.status = 'pending' AND f.id <> ALL (v_ran);
        RETURN NULL;
    END IF;
    INSERT INTO rota.scheduled (run_at, task_id)
    SELECT coalesce(f.eta, now()), f.id FROM loaded f
    WHERE f.attempts = 0 AND f.status = 'scheduled';
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT f.queue_id AS q, f.tenant_id AS t FROM loaded f
          WHERE f.attempts = 0 AND f.status = 'pending') pairs;
    IF v_pair_queues IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM rota.lock_tags(v_pair_queues, v_pair_tenants);
    -- rota.enter_line's placement, reading the new rows where they are:
    -- passing them to it as arrays cost a bulk load 1.2 us a task.
    WITH starts AS MATERIALIZED (
        SELECT * FROM rota.fair_starts(v_pair_queues, v_pair_tenants)
    ), placed AS MATERIALIZED (
        SELECT x.queue_id, x.tenant_id, x.seq, x.id, x.priority,
               s.start + sum(x.cost / s.weight) OVER w - x.cost / s.weight AS vtime,
               s.start + sum(x.cost / s.weight) OVER w AS finish
        FROM loaded x
        JOIN starts s ON s.queue_id = x.queue_id AND s.tenant_id = x.tenant_id
        WHERE x.attempts = 0 AND x.status = 'pending'
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq
                     ROWS UNBOUNDED PRECEDING)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT queue_id, vtime, tenant_id, seq, id, priority FROM placed
    )
    UPDATE rota.tenant_queues tq SET finish_tag = m.finish, last_start = m.start
    FROM (SELECT queue_id, tenant_id, max(finish) AS finish, max(vtime) AS start
          FROM placed GROUP BY 1, 2) m
    WHERE tq.queue_id = m.queue_id AND tq.tenant_id = m.tenant_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(v_pair_queues)));
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION rota.cancel(p_ids uuid[], p_actor text)
RETURNS TABLE (id uuid, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now uuid[];
BEGIN
    WITH unscheduled AS (
        DELETE FROM rota.scheduled s WHERE s.task_id = ANY (p_ids) RETURNING s.task_id
    )
    SELECT coalesce(array_agg(task_id), '{}') INTO v_now FROM unscheduled;
    WITH unready AS (
        DELETE FROM rota.ready r WHERE r.task_id = ANY (p_ids) RETURNING r.task_id
    ), unparked AS (
        -- Their keys' parked counts are put right by rota.unpark.
        DELETE FROM rota.parked p WHERE p.task_id = ANY (p_ids) RETURNING p.task_id
    )
    SELECT v_now || coalesce(array_agg(task_id), '{}') INTO v_now
    FROM (SELECT task_id FROM unready UNION ALL SELECT task_id FROM unparked) u;
    -- Joins waiting for their members (scheduled, with no schedule yet).
    v_now := v_now || ARRAY(
        SELECT t.id FROM rota.tasks t JOIN rota.joins j ON j.task_id = t.id
        WHERE t.id = ANY (p_ids) AND t.status = 'scheduled' AND NOT t.id = ANY (v_now));
    UPDATE rota.tasks t
    SET status = 'cancelled', cancel_requested = true, finished_at = now(),
        last_error = 'cancelled by ' || p_actor
    WHERE t.id = ANY (v_now);
    -- Claimed: it ends with its attempt, and the worker holding it is told
    -- (rota_cancel: "worker task"), to stop it now.
    UPDATE rota.tasks t SET cancel_requested = true
    WHERE t.id = ANY (p_ids) AND t.status = 'pending' AND NOT t.id = ANY (v_now);
    PERFORM pg_notify('rota_cancel', r.worker || ' ' || r.task_id::text)
    FROM rota.running r WHERE r.task_id = ANY (p_ids);
    -- Their results' waiters learn it at once.
    PERFORM pg_notify('rota_results', c::text) FROM unnest(v_now) AS c;
    RETURN QUERY
    WITH outcomes AS (
        SELECT t.id,
               CASE WHEN t.id = ANY (v_now) THEN 'cancelled'
                    WHEN t.status = 'pending' THEN 'cancelling'
                    ELSE t.status::text END AS outcome
        FROM rota.tasks t WHERE t.id = ANY (p_ids)
        UNION ALL
        SELECT f.task_id, 'succeeded' FROM rota.finished f WHERE f.task_id = ANY (p_ids)
    ), logged AS (
        INSERT INTO rota.audit (actor, action, target, detail, count)
        SELECT p_actor, 'cancel', 'task', jsonb_build_object('ids', to_jsonb(p_ids)),
               count(*) FILTER (WHERE o.outcome IN ('cancelled', 'cancelling'))
        FROM outcomes o
    )
    SELECT o.id, o.outcome FROM outcomes o;
END
$$;

CREATE OR REPLACE FUNCTION rota.refresh_stats() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
    v_minute timestamptz := date_trunc('minute', now());
BEGIN
    -- One refresh at a time; a second caller leaves it to the first.
    IF NOT pg_try_advisory_xact_lock(hashtext('rota.refresh_stats')) THEN
        RETURN 0;
    END IF;
    -- The first refresh of a minute: the last minute's fair levels again,
    -- with its completions counted since its last refresh and the counts
    -- as they stood at its end (rota.stats, not yet recounted).
    IF (SELECT c.at FROM rota.stats_counted c) < v_minute THEN
        PERFORM rota.fair_levels(v_minute - interval '1 minute');
    END IF;
    -- Only what changed is written: rows of pairs with nothing left go,
    -- rows whose counts changed are updated, new pairs are inserted. A pair's
    -- unfinished tasks (in line or claimed) enter the history (rota.service)
    -- when they change, and hourly while they stay: readers carry the last
    -- record forward.
    WITH counts (queue_id, tenant_id, waiting, running, scheduled, dead, first_vtime) AS (
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, min(vtime)
        FROM rota.ready GROUP BY 1, 2
        UNION ALL
        -- Parked (waiting for their key's room): waiting, not first in line.
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, NULL
        FROM rota.parked GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, count(*), 0, 0, NULL FROM rota.running GROUP BY 1, 2
        UNION ALL
        SELECT t.queue_id, t.tenant_id, 0, 0, count(*), 0, NULL
        FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, 0, 0, count(*), NULL
        FROM rota.tasks WHERE status = 'dead' GROUP BY 1, 2
    ), grouped AS (
        SELECT queue_id, tenant_id, sum(waiting) AS waiting, sum(running) AS running,
               sum(scheduled) AS scheduled, sum(dead) AS dead, min(first_vtime) AS first_vtime
        FROM counts GROUP BY 1, 2
    ), diff AS MATERIALIZED (
        -- A full join is a hash or merge join: linear, whatever the
        -- estimates of a table that was empty when last analyzed.
        SELECT coalesce(g.queue_id, s.queue_id) AS queue_id,
               coalesce(g.tenant_id, s.tenant_id) AS tenant_id, s.ctid AS row_at,
               g.waiting, g.running, g.scheduled, g.dead, g.first_vtime,
               -- Within a tenant and queue, line order is arrival order: its
               -- first task in line is its oldest waiting (an index probe),
               -- the same task while its place and the count in line stay.
               CASE WHEN g.first_vtime = s.first_vtime AND g.waiting = s.waiting
                    THEN s.oldest_enqueued_at
                    ELSE (SELECT t.enqueued_at
                          FROM rota.ready r JOIN rota.tasks t ON t.id = r.task_id
                          WHERE r.queue_id = g.queue_id AND r.vtime = g.first_vtime
                            AND r.tenant_id = g.tenant_id
                          ORDER BY r.seq LIMIT 1)
               END AS oldest_enqueued_at,
               g.queue_id IS NULL AS gone, s.queue_id IS NULL AS added,
               g.queue_id IS NOT NULL AND s.queue_id IS NOT NULL
                   AND ((g.waiting, g.running, g.scheduled, g.dead, g.first_vtime)
                            IS DISTINCT FROM
                        (s.waiting, s.running, s.scheduled, s.dead, s.first_vtime))
                   AS changed,
               coalesce(g.waiting + g.running, 0) AS pending,
               CASE WHEN s.queue_id IS NULL THEN coalesce(g.waiting + g.running, 0) > 0
                    WHEN g.queue_id IS NULL THEN s.waiting + s.running > 0
                    ELSE g.waiting + g.running <> s.waiting + s.running
                         OR s.recorded_at < now() - interval '1 hour'
                         OR (s.recorded_at IS NULL AND g.waiting + g.running > 0)
               END AS record,
               s.recorded_at
        FROM grouped g FULL JOIN rota.stats s
            ON s.queue_id = g.queue_id AND s.tenant_id = g.tenant_id
    ), gone AS (
        DELETE FROM rota.stats WHERE ctid = ANY (ARRAY(SELECT row_at FROM diff WHERE gone))
    ), changed AS (
        UPDATE rota.stats s
        SET waiting = d.waiting, running = d.running, scheduled = d.scheduled, dead = d.dead,
            first_vtime = d.first_vtime, oldest_enqueued_at = d.oldest_enqueued_at,
            recorded_at = CASE WHEN d.record THEN now() ELSE d.recorded_at END
        FROM diff d
        WHERE s.ctid = d.row_at AND (d.changed OR d.record) AND NOT d.gone
    ), added AS (
        INSERT INTO rota.stats (queue_id, tenant_id, waiting, running, scheduled, dead,
                                oldest_enqueued_at, recorded_at, first_vtime)
        SELECT queue_id, tenant_id, waiting, running, scheduled, dead, oldest_enqueued_at,
               CASE WHEN record THEN now() END, first_vtime
        FROM diff WHERE added
    ), recorded AS (
        INSERT INTO rota.service AS v (minute, queue_id, tenant_id, completed, wait_seconds,
                                       pending)
        SELECT v_minute, queue_id, tenant_id, 0, 0, pending FROM diff WHERE record
        ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE SET pending = excluded.pending
    )
    SELECT count(*) INTO v_rows FROM grouped;
    INSERT INTO rota.stats_counted AS c (at) VALUES (now())
    ON CONFLICT (only_row) DO UPDATE SET at = excluded.at;
    -- The charts' history: this minute's row holds each gauge's last count
    -- in the minute and its largest; completions and deaths of this minute
    -- and the last are recounted (late commits land), the deaths by the
    -- partial index of dead tasks.
    INSERT INTO rota.queue_history AS h (minute, queue_id, waiting, running,
                                         oldest_wait_seconds, waiting_max, running_max,
                                         oldest_wait_max)
    SELECT v_minute, q.id, coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest), coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest)
    FROM rota.queues q
    LEFT JOIN (SELECT queue_id, sum(waiting) AS waiting, sum(running) AS running,
                      min(oldest_enqueued_at) AS oldest
               FROM rota.stats GROUP BY queue_id) s ON s.queue_id = q.id
    ON CONFLICT (minute, queue_id) DO UPDATE
    SET waiting = excluded.waiting, running = excluded.running,
        oldest_wait_seconds = excluded.oldest_wait_seconds,
        waiting_max = greatest(h.waiting_max, excluded.waiting_max),
        running_max = greatest(h.running_max, excluded.running_max),
        oldest_wait_max = greatest(h.oldest_wait_max, excluded.oldest_wait_max);
    UPDATE rota.queue_history h
    SET completed = coalesce(v.completed, 0), died = coalesce(d.died, 0)
    FROM rota.queue_history x
    LEFT JOIN (SELECT minute, queue_id, sum(completed) AS completed FROM rota.service
               WHERE minute >= v_minute - interval '1 minute' GROUP BY 1, 2) v
        ON v.minute = x.minute AND v.queue_id = x.queue_id
    LEFT JOIN (SELECT date_trunc('minute', finished_at) AS minute, queue_id, count(*) AS died
               FROM rota.tasks
               WHERE status = 'dead' AND finished_at >= v_minute - interval '1 minute'
               GROUP BY 1, 2) d
        ON d.minute = x.minute AND d.queue_id = x.queue_id
    WHERE x.minute >= v_minute - interval '1 minute'
      AND h.minute = x.minute AND h.queue_id = x.queue_id;
    -- This minute's fair levels, from the counts now; a minute keeps those
    -- of its last refresh, and its first refresh of the next minute
    -- recomputed them (above) with the completions counted since.
    PERFORM rota.fair_levels(v_minute);
    DELETE FROM rota.queue_history WHERE minute < now() - interval '1 day';
    RETURN v_rows;
END
$$;

-- Keys of limits for names of tasks just loaded into these queues (made on
-- first sight, in name order: loads making the same ones cannot deadlock),
-- and the queues marked as checking them (once: a marked queue's row is not
-- written). A name whose limit does not exist gets no row: its tasks run
-- unlimited.
CREATE FUNCTION rota.make_keys(p_names text[], p_queue_ids integer[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- A new key's bucket starts full, as a new limit's does.
    INSERT INTO rota.keys (name, limit_id, tokens)
    SELECT n, l.id, l.rate_burst
    FROM unnest(p_names) n JOIN rota.key_limits l ON l.name = split_part(n, '/', 1)
    WHERE NOT EXISTS (SELECT FROM rota.keys k WHERE k.name = n)
    ORDER BY n
    ON CONFLICT (name) DO NOTHING;
    IF EXISTS (SELECT FROM unnest(p_names) n
               JOIN rota.key_limits l ON l.name = split_part(n, '/', 1)) THEN
        UPDATE rota.queues q SET key_limited = true
        WHERE q.id = ANY (p_queue_ids) AND NOT q.key_limited;
    END IF;
END
$$;

-- A claim's admission on keys (rota.claim calls it while some limit exists):
-- of the tasks given in line order, each whose key is limited takes a free
-- slot and a token of it, as many as the key has; the others are parked.
-- Keys are locked in id order, after the claim's tenant rows, as every
-- writer of key counters locks them; FOR UPDATE reads the latest committed
-- counters, so racing claims cannot both take a key's last slot. Then parked
-- tasks of keys with room go back in line (rota.unpark): last, as nothing
-- after it in the claim waits for a lock. Returns each keyed task's verdict
-- and, when its key counts it, the key.
CREATE FUNCTION rota.key_admit(p_ids uuid[], p_queue_ids integer[], p_vtimes double precision[],
                               p_tenant_ids integer[], p_seqs bigint[], p_priorities smallint[])
RETURNS TABLE (task_id uuid, key_id integer, fits boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH given AS MATERIALIZED (
        SELECT x.*, k.id AS key
        FROM unnest(p_ids, p_queue_ids, p_vtimes, p_tenant_ids, p_seqs, p_priorities)
                 WITH ORDINALITY AS x(id, queue_id, vtime, tenant_id, seq, priority, i)
        JOIN rota.tasks t ON t.id = x.id
        JOIN rota.keys k ON k.name = t.limit_key
        WHERE t.id = ANY (p_ids) AND t.limit_key IS NOT NULL
    ), room AS MATERIALIZED (
        SELECT k.id, l.concurrency_limit - k.running AS free_slots,
               rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens, k.refilled_at) AS tokens,
               l.concurrency_limit IS NOT NULL AS counts, l.rate_limit IS NOT NULL AS rated
        FROM rota.keys k JOIN rota.key_limits l ON l.id = k.limit_id
        WHERE k.id = ANY (ARRAY(SELECT DISTINCT key FROM given))
        ORDER BY k.id
        FOR UPDATE OF k
    ), verdicts AS MATERIALIZED (
        SELECT g.*, r.counts,
               row_number() OVER (PARTITION BY g.key ORDER BY g.i)
                   <= least(coalesce(r.free_slots, 2147483647), coalesce(floor(r.tokens), 2147483647))
                   AS fits
        FROM given g JOIN room r ON r.id = g.key
    ), charged AS (
        UPDATE rota.keys k
        SET running = k.running + CASE WHEN r.counts THEN c.taken ELSE 0 END,
            tokens = CASE WHEN r.rated THEN r.tokens - c.taken ELSE k.tokens END,
            refilled_at = CASE WHEN r.rated THEN now() ELSE k.refilled_at END,
            parked = k.parked + c.set_aside
        FROM (SELECT v.key, count(*) FILTER (WHERE v.fits) AS taken,
                     count(*) FILTER (WHERE NOT v.fits) AS set_aside
              FROM verdicts v GROUP BY v.key) c
        JOIN room r ON r.id = c.key
        WHERE k.id = c.key AND k.id = ANY (ARRAY(SELECT id FROM room))
    ), set_aside AS (
        INSERT INTO rota.parked (key_id, queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT v.key, v.queue_id, v.vtime, v.tenant_id, v.seq, v.id, v.priority
        FROM verdicts v WHERE NOT v.fits
    )
    SELECT v.id, CASE WHEN v.counts AND v.fits THEN v.key END, v.fits FROM verdicts v;
    IF EXISTS (SELECT FROM rota.keys k WHERE k.parked > 0) THEN
        PERFORM rota.unpark();
    END IF;
END
$$;

-- Puts parked tasks of keys with room again back in line, each at its own
-- place (ahead of what was loaded since: it has waited its turn). A key's
-- room is its free slots and whole tokens; without its limit, all of them.
-- Key rows locked elsewhere are skipped: never waiting, this closes no
-- lock cycle, and the holder (a claim or a release) leads to the next call.
-- Returns how many went back.
CREATE FUNCTION rota.unpark() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_queues integer[];
    v_moved integer;
BEGIN
    WITH room AS MATERIALIZED (
        SELECT k.id, k.parked,
               least(k.parked,
                     coalesce(l.concurrency_limit - k.running, k.parked),
                     coalesce(floor(rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens,
                                                    k.refilled_at))::integer, k.parked)) AS n
        FROM rota.keys k LEFT JOIN rota.key_limits l ON l.id = k.limit_id
        WHERE k.parked > 0
          AND least(k.parked,
                    coalesce(l.concurrency_limit - k.running, k.parked),
                    coalesce(floor(rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens,
                                                   k.refilled_at))::integer, k.parked)) > 0
        ORDER BY k.id
        FOR UPDATE OF k SKIP LOCKED
    ), chosen AS MATERIALIZED (
        SELECT x.task_id, r.id AS key_id
        FROM room r
        CROSS JOIN LATERAL (
            SELECT p.task_id FROM rota.parked p WHERE p.key_id = r.id
            ORDER BY p.vtime, p.tenant_id, p.seq LIMIT r.n
        ) x
    ), moved AS MATERIALIZED (
        DELETE FROM rota.parked p WHERE p.task_id = ANY (ARRAY(SELECT task_id FROM chosen))
        RETURNING p.*
    ), back AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT m.queue_id, m.vtime, m.tenant_id, m.seq, m.task_id, m.priority FROM moved m
    ), recounted AS (
        -- Fewer found than counted (a parked task was cancelled): recounted.
        -- The statement's snapshot still holds the rows it moved.
        UPDATE rota.keys k
        SET parked = CASE WHEN coalesce(m.n, 0) < r.n
                          THEN (SELECT count(*) FROM rota.parked p WHERE p.key_id = r.id)
                               - coalesce(m.n, 0)
                          ELSE k.parked - m.n END
        FROM room r LEFT JOIN (SELECT key_id, count(*) AS n FROM moved GROUP BY key_id) m
               ON m.key_id = r.id
        WHERE k.id = r.id AND k.id = ANY (ARRAY(SELECT id FROM room))
    )
    SELECT array_agg(DISTINCT m.queue_id), count(*) INTO v_queues, v_moved FROM moved m;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q WHERE q.id = ANY (v_queues);
    RETURN v_moved;
END
$$;

-- Creates or changes a limit on keys (NULLs: no concurrency or rate
-- limit). Its keys' running counters are recounted when it gets or loses a
-- concurrency; a changed rate starts each key with a full bucket. Keys of
-- tasks already loaded are made. `p_declared`: set from code (a worker's
-- declaration), else an operator's (kept over declarations until reset).
CREATE FUNCTION rota.set_limit(p_name text, p_concurrency_limit integer,
                               p_rate_limit double precision, p_rate_burst double precision,
                               p_declared boolean, p_actor text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
    v_burst double precision := coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1)));
    v_keys text[];
    v_queues integer[];
BEGIN
    INSERT INTO rota.key_limits (name, concurrency_limit, rate_limit, rate_burst, declared)
    VALUES (p_name, p_concurrency_limit, p_rate_limit, v_burst, p_declared)
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = excluded.concurrency_limit, rate_limit = excluded.rate_limit,
        rate_burst = excluded.rate_burst, declared = excluded.declared, updated_at = now()
    RETURNING id INTO v_id;
    -- Keys left by a dropped limit of this name are this one's.
    UPDATE rota.keys SET limit_id = v_id
    WHERE split_part(name, '/', 1) = p_name AND limit_id <> v_id;
    -- Tasks loaded before (a scan of the table: a limit is set seldom).
    SELECT array_agg(DISTINCT t.limit_key), array_agg(DISTINCT t.queue_id)
    INTO v_keys, v_queues
    FROM rota.tasks t
    WHERE t.limit_key IS NOT NULL AND split_part(t.limit_key, '/', 1) = p_name;
    PERFORM rota.make_keys(v_keys, v_queues);
    -- Running rows first, then key rows: the order a release takes them in.
    UPDATE rota.running r
    SET key_id = CASE WHEN p_concurrency_limit IS NOT NULL THEN k.id END
    FROM rota.tasks t JOIN rota.keys k ON k.name = t.limit_key
    WHERE t.id = r.task_id AND k.limit_id = v_id AND t.limit_key IS NOT NULL
      AND r.key_id IS DISTINCT FROM CASE WHEN p_concurrency_limit IS NOT NULL THEN k.id END;
    UPDATE rota.keys k
    SET running = (SELECT count(*) FROM rota.running r WHERE r.key_id = k.id),
        tokens = v_burst, refilled_at = now()
    FROM (SELECT id FROM rota.keys WHERE limit_id = v_id ORDER BY id FOR UPDATE) locked
    WHERE k.id = locked.id;
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'set limit', 'limit:' || p_name,
            jsonb_build_object('concurrency', p_concurrency_limit, 'rate', p_rate_limit,
                               'burst', v_burst, 'declared', p_declared), 1);
    -- Parked tasks may have room now.
    PERFORM rota.unpark();
    RETURN v_id;
END
$$;

-- The limits an app's code declares, set as declared unless an operator set
-- them (rota.set_limit with p_declared false; `rota limit reset` hands a
-- limit back to its declaration). Unchanged ones are left alone. Returns the
-- names set.
CREATE FUNCTION rota.declare_limits(p_names text[], p_concurrency integer[],
                                    p_rates double precision[], p_bursts double precision[],
                                    p_actor text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    d record;
BEGIN
    FOR d IN
        SELECT x.name, x.concurrency, x.rate,
               coalesce(x.burst, greatest(1, coalesce(x.rate, 1))) AS burst
        FROM unnest(p_names, p_concurrency, p_rates, p_bursts) AS x(name, concurrency, rate, burst)
        LEFT JOIN rota.key_limits l ON l.name = x.name
        WHERE l.id IS NULL
           OR (l.declared AND (l.concurrency_limit, l.rate_limit, l.rate_burst)
                              IS DISTINCT FROM (x.concurrency, x.rate,
                                                coalesce(x.burst, greatest(1, coalesce(x.rate, 1)))))
        ORDER BY x.name
    LOOP
        PERFORM rota.set_limit(d.name, d.concurrency, d.rate, d.burst, true, p_actor);
        RETURN NEXT d.name;
    END LOOP;
END
$$;

-- Removes a limit: its keys' tasks run unlimited, the parked ones back in
-- line at their places. Returns false for an unknown name.
CREATE FUNCTION rota.drop_limit(p_name text, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM rota.key_limits WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    -- Running rows first, then key rows: the order a release takes them in.
    UPDATE rota.running r SET key_id = NULL
    WHERE r.key_id = ANY (ARRAY(SELECT k.id FROM rota.keys k WHERE k.limit_id = v_id));
    PERFORM FROM rota.keys k WHERE k.limit_id = v_id ORDER BY k.id FOR UPDATE;
    WITH moved AS (
        DELETE FROM rota.parked p
        WHERE p.key_id = ANY (ARRAY(SELECT k.id FROM rota.keys k WHERE k.limit_id = v_id))
        RETURNING p.*
    )
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
    SELECT m.queue_id, m.vtime, m.tenant_id, m.seq, m.task_id, m.priority FROM moved m;
    DELETE FROM rota.keys k WHERE k.limit_id = v_id;
    IF NOT EXISTS (SELECT FROM rota.key_limits) THEN
        UPDATE rota.queues SET key_limited = false WHERE key_limited;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, 'drop limit', 'limit:' || p_name, 1);
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q;
    RETURN true;
END
$$;

-- Workers declare their app's limits and put parked tasks back (a
-- maintenance duty) as the schema's owner.
ALTER FUNCTION rota.declare_limits(text[], integer[], double precision[], double precision[], text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.unpark() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Each limit with its keys' counters: running, parked, and the key with the
-- most running, for `rota limit list` and the console.
CREATE VIEW rota.limit_usage AS
SELECT l.name, l.concurrency_limit, l.rate_limit, l.rate_burst, l.declared, l.updated_at,
       count(k.id) AS keys,
       coalesce(sum(k.running), 0) AS running,
       coalesce(max(k.running), 0) AS busiest_running,
       (SELECT count(*) FROM rota.parked p JOIN rota.keys pk ON pk.id = p.key_id
        WHERE pk.limit_id = l.id) AS parked
FROM rota.key_limits l LEFT JOIN rota.keys k ON k.limit_id = l.id
GROUP BY l.id;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
