-- rota 0001: the fair queue core.
--
-- Where tasks live:
--   tasks      the body of every task, loaded once (the id is minted by the producer);
--   ready      a narrow table of claimable tasks in fair order; rows leave on claim;
--   running    claimed tasks with their lease and attempt token (fencing);
--   scheduled  tasks waiting for an ETA or a retry backoff; they get their fair
--              position when they fall due.
-- Fairness is decided at insert time (start-time fair queueing, docs/architecture.md):
-- a claim is a plain index scan of ready in (vtime, tenant slot, arrival) order.

CREATE SCHEMA IF NOT EXISTS rota;

CREATE TABLE rota.migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rota.queues (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CONSTRAINT queue_name_rule CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    -- The largest start tag given so far: the virtual clock when nothing waits.
    max_start double precision NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rota.tenants (
    -- The id is the tenant's slot: it breaks ties between tenants within a round.
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE
        CONSTRAINT tenant_name_rule CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$'),
    weight double precision NOT NULL DEFAULT 1 CONSTRAINT weight_positive CHECK (weight > 0),
    concurrency_limit integer CONSTRAINT concurrency_limit_not_negative CHECK (concurrency_limit >= 0),
    rate_limit double precision CONSTRAINT rate_limit_positive CHECK (rate_limit > 0),
    rate_burst double precision NOT NULL DEFAULT 1 CONSTRAINT rate_burst_at_least_one CHECK (rate_burst >= 1),
    capacity bigint CONSTRAINT capacity_not_negative CHECK (capacity >= 0),
    -- Claimed-and-unfinished tasks, kept only while a concurrency limit is set.
    running integer NOT NULL DEFAULT 0,
    -- Token bucket of the rate limit.
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    limited boolean GENERATED ALWAYS AS (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL) STORED,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenants_limited ON rota.tenants (id) WHERE limited;

-- Each tenant's virtual finish tag, per queue.
CREATE TABLE rota.tenant_queues (
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    finish_tag double precision NOT NULL,
    PRIMARY KEY (queue_id, tenant_id)
);

-- Succeeded tasks are not here but in rota.finished.
CREATE TYPE rota.task_status AS ENUM ('pending', 'scheduled', 'dead');

CREATE SEQUENCE rota.task_seq AS bigint CACHE 1000;

-- No foreign keys on the hot tables: the queue functions keep them consistent,
-- and a per-row FK check would cost bulk loading and claiming.
CREATE TABLE rota.tasks (
    id uuid PRIMARY KEY,
    seq bigint NOT NULL DEFAULT nextval('rota.task_seq'),
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL,
    cost double precision NOT NULL DEFAULT 1 CONSTRAINT cost_positive CHECK (cost > 0),
    max_attempts integer NOT NULL DEFAULT 3 CONSTRAINT max_attempts_positive CHECK (max_attempts >= 1),
    backoff_base double precision NOT NULL DEFAULT 1,
    backoff_max double precision NOT NULL DEFAULT 3600,
    -- pending: in ready or running (the running table tells which).
    status rota.task_status NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    eta timestamptz,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    loaded_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    last_error text
) WITH (fillfactor = 90);

CREATE TABLE rota.ready (
    queue_id integer NOT NULL,
    vtime double precision NOT NULL,
    tenant_id integer NOT NULL,
    seq bigint NOT NULL,
    task_id uuid NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 100000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX ready_fair_order ON rota.ready (queue_id, vtime, tenant_id, seq);

-- Small (in-flight tasks only): no index beyond the key is worth its upkeep.
CREATE TABLE rota.running (
    task_id uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    vtime double precision NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL,
    worker text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz NOT NULL,
    -- Whether the tenant's running counter includes this task.
    counted boolean NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

-- Append-only log of succeeded tasks, narrow. Its key also keeps a batch
-- that is loaded again (a loader died before acknowledging it) from bringing
-- back tasks that already ran; UUIDv7 ids make its inserts append at the right
-- edge of the index.
CREATE TABLE rota.finished (
    task_id uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    attempts integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX finished_at ON rota.finished USING brin (finished_at);

CREATE TABLE rota.scheduled (
    run_at timestamptz NOT NULL,
    task_id uuid NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX scheduled_run_at ON rota.scheduled (run_at);

-- The queue's virtual clock: the smallest start tag still waiting, or the
-- largest ever given when nothing waits.
CREATE FUNCTION rota.vclock(p_queue_id integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT r.vtime FROM rota.ready r WHERE r.queue_id = p_queue_id ORDER BY r.vtime LIMIT 1),
        (SELECT q.max_start FROM rota.queues q WHERE q.id = p_queue_id),
        0)
$$;

-- Gives tasks their fair place in line and makes them claimable. The caller
-- holds the rows of their queues locked (rota.lock_queues), so loaders and
-- schedulers of the same queue take turns and each reads a settled clock.
CREATE FUNCTION rota.make_ready(
    p_ids uuid[], p_seqs bigint[], p_queue_ids integer[], p_tenant_ids integer[], p_costs double precision[]
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    WITH batch AS (
        SELECT * FROM unnest(p_ids, p_seqs, p_queue_ids, p_tenant_ids, p_costs)
            AS b(id, seq, queue_id, tenant_id, cost)
    ), clock AS MATERIALIZED (  -- read once per queue, not once per tenant or task
        SELECT q.queue_id, rota.vclock(q.queue_id) AS v FROM (SELECT DISTINCT queue_id FROM batch) q
    ), tenant_base AS MATERIALIZED (
        -- Per (queue, tenant) of the batch, not per task: where its next task
        -- starts, S = max(V, F), and its weight.
        SELECT p.queue_id, p.tenant_id, t.weight,
               greatest(c.v, coalesce(tq.finish_tag, c.v)) AS start
        FROM (SELECT DISTINCT queue_id, tenant_id FROM batch) p
        JOIN clock c ON c.queue_id = p.queue_id
        JOIN rota.tenants t ON t.id = p.tenant_id
        LEFT JOIN rota.tenant_queues tq ON tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id
    ), finished AS (
        -- Each next task of a tenant starts where its previous one finished:
        -- F = S + cost / weight.
        SELECT b.id, b.seq, b.queue_id, b.tenant_id, b.cost / tb.weight AS step,
               tb.start + sum(b.cost / tb.weight) OVER (PARTITION BY b.queue_id, b.tenant_id
                                                        ORDER BY b.seq ROWS UNBOUNDED PRECEDING)
                 AS finish
        FROM batch b
        JOIN tenant_base tb ON tb.queue_id = b.queue_id AND tb.tenant_id = b.tenant_id
    ), tagged AS (
        SELECT id, seq, queue_id, tenant_id, finish - step AS vtime, finish FROM finished
    ), into_ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id)
        SELECT queue_id, vtime, tenant_id, seq, id FROM tagged
    ), finish_tags AS (
        INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
        SELECT queue_id, tenant_id, max(finish) FROM tagged GROUP BY queue_id, tenant_id
        ORDER BY queue_id, tenant_id
        ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = excluded.finish_tag
    ), clocks AS (
        UPDATE rota.queues q SET max_start = greatest(q.max_start, m.s)
        FROM (SELECT queue_id, max(vtime) AS s FROM tagged GROUP BY queue_id) m
        WHERE q.id = m.queue_id
    )
    SELECT count(*) INTO v_count FROM tagged;

    -- One notification per queue and batch, never one per task.
    PERFORM pg_notify('rota_ready', q.name)
    FROM rota.queues q WHERE q.id = ANY(p_queue_ids);
    RETURN v_count;
END
$$;

-- Locks queue rows in id order: every writer of fair tags takes them the same way.
CREATE FUNCTION rota.lock_queues(p_queue_ids integer[]) RETURNS void
LANGUAGE sql AS $$
    SELECT NULL FROM (
        SELECT id FROM rota.queues WHERE id = ANY(p_queue_ids) ORDER BY id FOR UPDATE
    ) locked
$$;

-- Turns the session's staged batch (pg_temp.rota_staging, filled by COPY)
-- into tasks. Duplicate ids (a batch loaded twice) are ignored. Returns how
-- many new tasks were stored.
CREATE FUNCTION rota.load_staged() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_queue_ids integer[];
    v_ids uuid[]; v_seqs bigint[]; v_qids integer[]; v_tids integer[]; v_costs double precision[];
    v_loaded integer;
    v_insert text;
BEGIN
    -- Unknown queues and tenants are created in name order (no deadlocks
    -- between loaders creating the same ones).
    INSERT INTO rota.queues (name)
    SELECT DISTINCT s.queue FROM pg_temp.rota_staging s
    WHERE NOT EXISTS (SELECT 1 FROM rota.queues q WHERE q.name = s.queue)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO rota.tenants (name)
    SELECT DISTINCT s.tenant FROM pg_temp.rota_staging s
    WHERE NOT EXISTS (SELECT 1 FROM rota.tenants t WHERE t.name = s.tenant)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;

    SELECT array_agg(q.id) INTO v_queue_ids FROM rota.queues q
    WHERE q.name IN (SELECT DISTINCT queue FROM pg_temp.rota_staging);
    IF v_queue_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM rota.lock_queues(v_queue_ids);

    -- Tasks already succeeded (in rota.finished) are skipped by the WHERE; a
    -- repeated id still waiting (in this batch or an earlier one) by ON
    -- CONFLICT. Repeats are rare (a replayed batch), and a plain INSERT is a
    -- third cheaper than one with ON CONFLICT: try that first, and only when a
    -- repeat makes it fail, load the batch again skipping conflicts.
    v_insert := $sql$
        WITH inserted AS (
            INSERT INTO rota.tasks AS t (id, queue_id, tenant_id, name, payload, cost,
                                         max_attempts, backoff_base, backoff_max, status, eta,
                                         enqueued_at)
            SELECT s.id, q.id, tn.id, s.name, s.payload, s.cost, s.max_attempts,
                   s.backoff_base, s.backoff_max,
                   CASE WHEN s.eta > now() THEN 'scheduled' ELSE 'pending' END::rota.task_status,
                   s.eta, s.enqueued_at
            FROM pg_temp.rota_staging s
            JOIN rota.queues q ON q.name = s.queue
            JOIN rota.tenants tn ON tn.name = s.tenant
            WHERE s.id <> ALL (ARRAY(
                SELECT f.task_id FROM rota.finished f
                WHERE f.task_id = ANY (ARRAY(SELECT id FROM pg_temp.rota_staging))))
            ORDER BY s.arrival
            %s
            RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.status, t.eta
        ), later AS (
            INSERT INTO rota.scheduled (run_at, task_id)
            SELECT eta, id FROM inserted WHERE status = 'scheduled'
        ), now_ready AS (
            SELECT * FROM inserted WHERE status = 'pending' ORDER BY seq
        )
        SELECT (SELECT count(*) FROM inserted), array_agg(id), array_agg(seq),
               array_agg(queue_id), array_agg(tenant_id), array_agg(cost)
        FROM now_ready
    $sql$;
    BEGIN
        EXECUTE format(v_insert, '')
        INTO v_loaded, v_ids, v_seqs, v_qids, v_tids, v_costs;
    EXCEPTION WHEN unique_violation THEN
        EXECUTE format(v_insert, 'ON CONFLICT (id) DO NOTHING')
        INTO v_loaded, v_ids, v_seqs, v_qids, v_tids, v_costs;
    END;

    IF v_ids IS NOT NULL THEN
        PERFORM rota.make_ready(v_ids, v_seqs, v_qids, v_tids, v_costs);
    END IF;
    RETURN coalesce(v_loaded, 0);
END
$$;

-- Moves due scheduled tasks (ETA reached, retry backoff over) into line.
CREATE FUNCTION rota.promote_due(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[]; v_seqs bigint[]; v_qids integer[]; v_tids integer[]; v_costs double precision[];
BEGIN
    WITH due AS (
        DELETE FROM rota.scheduled
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM rota.scheduled WHERE run_at <= now()
            ORDER BY run_at LIMIT p_limit FOR UPDATE SKIP LOCKED))
        RETURNING task_id
    ), promoted AS (
        UPDATE rota.tasks t SET status = 'pending'
        WHERE t.id = ANY(ARRAY(SELECT task_id FROM due)) AND t.status = 'scheduled'
        RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost
    )
    SELECT array_agg(id ORDER BY seq), array_agg(seq ORDER BY seq), array_agg(queue_id ORDER BY seq),
           array_agg(tenant_id ORDER BY seq), array_agg(cost ORDER BY seq)
    INTO v_ids, v_seqs, v_qids, v_tids, v_costs
    FROM promoted;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM rota.lock_queues(ARRAY(SELECT DISTINCT unnest(v_qids)));
    RETURN rota.make_ready(v_ids, v_seqs, v_qids, v_tids, v_costs);
END
$$;

-- Takes claimed tasks off the running table, keeping each limited tenant's
-- counter right. Tenant rows are locked in id order, as claims lock them.
CREATE FUNCTION rota.take_running(p_ids uuid[], p_attempts integer[])
RETURNS SETOF rota.running
LANGUAGE plpgsql AS $$
DECLARE
    v_rows rota.running[];
BEGIN
    WITH taken AS (
        DELETE FROM rota.running r
        USING unnest(p_ids, p_attempts) AS x(id, attempt)
        WHERE r.task_id = x.id AND (x.attempt IS NULL OR r.attempt = x.attempt)
        RETURNING r.*
    )
    SELECT array_agg(taken) INTO v_rows FROM taken;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE (r).counted) THEN
        -- No limited tenant among them: leave rota.tenants (and its locks) alone.
        RETURN QUERY SELECT * FROM unnest(v_rows);
        RETURN;
    END IF;
    PERFORM NULL FROM (
        SELECT t.id FROM rota.tenants t
        WHERE t.id = ANY(ARRAY(SELECT (r).tenant_id FROM unnest(v_rows) r WHERE (r).counted))
        ORDER BY t.id FOR UPDATE
    ) locked;
    UPDATE rota.tenants t SET running = greatest(t.running - d.n, 0)
    FROM (SELECT (r).tenant_id AS tenant_id, count(*) AS n FROM unnest(v_rows) r
          WHERE (r).counted GROUP BY 1) d
    WHERE t.id = ANY (ARRAY(SELECT (r).tenant_id FROM unnest(v_rows) r WHERE (r).counted))
      AND t.id = d.tenant_id;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;

-- Finishes claimed tasks successfully: they leave rota.tasks (a delete is far
-- cheaper than rewriting the wide row) for the narrow rota.finished log.
-- Returns the ids completed; an id whose attempt token is stale (the lease
-- expired and the task was given to someone else) is refused and left alone.
CREATE FUNCTION rota.complete(p_ids uuid[], p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
BEGIN
    -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key: a join on
    -- a function's result is estimated at 1000 rows and turns into a seq scan.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT task_id, queue_id, tenant_id, attempt, claimed_at
        FROM rota.take_running(p_ids, p_attempts)
    ), gone AS (
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT task_id FROM done))
        RETURNING t.id, t.enqueued_at
    )
    INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at)
    SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at
    FROM done d JOIN gone g ON g.id = d.task_id
    RETURNING task_id;
END
$$;

-- Drops finished-task records older than the given age (retention).
CREATE FUNCTION rota.prune_finished(p_older_than interval) RETURNS bigint
LANGUAGE sql AS $$
    WITH pruned AS (
        DELETE FROM rota.finished WHERE finished_at < now() - p_older_than RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Fails claimed tasks: each is retried after its backoff (exponential, with
-- jitter), or at p_retry_at when given (an explicit retry), until its last
-- attempt; then, or at once when p_final (an unknown task, say), it is dead,
-- with its last error kept. Stale tokens are refused.
CREATE FUNCTION rota.fail(
    p_ids uuid[], p_attempts integer[], p_errors text[], p_retry_at timestamptz[],
    p_final boolean[]
) RETURNS TABLE (id uuid, status rota.task_status, run_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH failed AS MATERIALIZED (
        SELECT r.task_id, r.attempt, x.error, x.retry_at, x.final
        FROM rota.take_running(p_ids, p_attempts) r
        JOIN unnest(p_ids, p_errors, p_retry_at, p_final) AS x(id, error, retry_at, final)
          ON x.id = r.task_id
    ), decided AS (
        SELECT f.task_id, f.attempt, f.error,
               CASE WHEN f.final OR f.attempt >= t.max_attempts THEN NULL
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
    SET status = CASE WHEN d.run_at IS NULL THEN 'dead' ELSE 'scheduled' END::rota.task_status,
        attempts = d.attempt, last_error = d.error,
        finished_at = CASE WHEN d.run_at IS NULL THEN now() END
    FROM decided d
    WHERE t.id = ANY (ARRAY(SELECT task_id FROM failed)) AND t.id = d.task_id
    RETURNING t.id, t.status, d.run_at;
END
$$;

-- Exponential backoff with "equal jitter": half the delay fixed, half random,
-- so that a burst of failures does not retry in lockstep.
CREATE FUNCTION rota.backoff_seconds(p_attempt integer, p_base double precision, p_max double precision)
RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT d / 2 + random() * d / 2
    FROM (SELECT least(p_max, p_base * power(2, least(p_attempt - 1, 60))) AS d) x
$$;

-- Puts claimed tasks back in line at the place they had. p_consume says
-- whether the attempt counts: it does for an expired lease or a dead worker
-- (the task may have run), not for a task handed back unstarted at shutdown.
-- A task out of attempts is dead instead. Returns the ids put back in line.
CREATE FUNCTION rota.requeue(p_ids uuid[], p_attempts integer[], p_consume boolean, p_reason text)
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
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

    RETURN QUERY
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id)
    SELECT r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id
    FROM unnest(v_rows) r JOIN rota.tasks t ON t.id = r.task_id
    WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x)) AND t.status = 'pending'
    RETURNING task_id;

    PERFORM pg_notify('rota_ready', q.name)
    FROM rota.queues q WHERE q.id IN (SELECT r.queue_id FROM unnest(v_rows) r);
END
$$;

-- Requeues the tasks whose lease ran out.
CREATE FUNCTION rota.requeue_expired() RETURNS SETOF uuid
LANGUAGE sql AS $$
    SELECT rota.requeue(array_agg(task_id), array_agg(attempt), true, 'lease expired')
    FROM rota.running WHERE lease_expires_at < now()
$$;

-- Creates or changes a tenant. The running counter is recounted when a
-- concurrency limit is set; a fresh rate limit starts with a full bucket.
CREATE FUNCTION rota.configure_tenant(
    p_name text, p_weight double precision, p_concurrency_limit integer,
    p_rate_limit double precision, p_rate_burst double precision, p_capacity bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    INSERT INTO rota.tenants (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT id INTO v_id FROM rota.tenants WHERE name = p_name FOR UPDATE;
    UPDATE rota.running SET counted = (p_concurrency_limit IS NOT NULL) WHERE tenant_id = v_id;
    UPDATE rota.tenants SET
        weight = p_weight,
        concurrency_limit = p_concurrency_limit,
        rate_limit = p_rate_limit,
        rate_burst = coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1))),
        capacity = p_capacity,
        running = CASE WHEN p_concurrency_limit IS NULL THEN 0
                       ELSE (SELECT count(*) FROM rota.running r WHERE r.tenant_id = v_id) END,
        tokens = coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1))),
        refilled_at = now()
    WHERE id = v_id;
    RETURN v_id;
END
$$;

-- How much work (in cost units) each tenant has waiting, estimated from the
-- fair tags: a tenant's finish tag runs ahead of the clock by its backlog
-- divided by its weight. O(1) per tenant, for backpressure.
CREATE VIEW rota.tenant_backlog AS
SELECT t.name AS tenant, t.capacity,
       coalesce(sum(greatest(0, tq.finish_tag - rota.vclock(tq.queue_id)) * t.weight), 0) AS backlog
FROM rota.tenants t
LEFT JOIN rota.tenant_queues tq ON tq.tenant_id = t.id
GROUP BY t.id;
