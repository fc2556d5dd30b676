-- rota 0034: loads of different tenants of one queue no longer take turns.
-- A load locks the tag rows of its (queue, tenant) pairs, in (queue, tenant)
-- order, where it locked the queue's row; the largest start given moves from
-- rota.queues.max_start (written by every load) to each pair's last_start,
-- which the virtual clock reads through an index when nothing waits.
-- rota.queues.max_start stays as the clock's floor (what it held until now,
-- and what a shard's clock may be lifted to). The Spark loader's ledger is
-- keyed by partition too: each executor loads its partition in its own
-- transaction.

ALTER TABLE rota.tenant_queues ADD COLUMN last_start double precision NOT NULL DEFAULT 0;
CREATE INDEX tenant_queues_last_start ON rota.tenant_queues (queue_id, last_start);

ALTER TABLE rota.loader_batches ADD COLUMN part integer NOT NULL DEFAULT 0;
ALTER TABLE rota.loader_batches DROP CONSTRAINT loader_batches_pkey;
ALTER TABLE rota.loader_batches ADD PRIMARY KEY (query, batch_id, part);

CREATE OR REPLACE FUNCTION rota.vclock(p_queue_id integer) RETURNS double precision
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN coalesce(
        (SELECT r.vtime FROM rota.ready r WHERE r.queue_id = p_queue_id ORDER BY r.vtime LIMIT 1),
        greatest(
            (SELECT q.max_start FROM rota.queues q WHERE q.id = p_queue_id),
            (SELECT tq.last_start FROM rota.tenant_queues tq WHERE tq.queue_id = p_queue_id
             ORDER BY tq.last_start DESC LIMIT 1)),
        0);
END
$$;

DROP FUNCTION rota.lock_queues(integer[]);

CREATE FUNCTION rota.lock_tags(p_queue_ids integer[], p_tenant_ids integer[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
    SELECT p.q, p.t, 0 FROM unnest(p_queue_ids, p_tenant_ids) AS p(q, t) ORDER BY 1, 2
    ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = tq.finish_tag WHERE false;
END
$$;
REVOKE EXECUTE ON FUNCTION rota.lock_tags(integer[], integer[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION rota.fair_starts(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS TABLE (queue_id integer, tenant_id integer, weight double precision,
               start double precision)
LANGUAGE plpgsql SECURITY DEFINER
SET enable_seqscan = off SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v FROM (SELECT DISTINCT unnest(p_queue_ids) AS id) q
    )
    SELECT p.queue_id, p.tenant_id,
           (SELECT t.weight FROM rota.tenants t WHERE t.id = p.tenant_id),
           greatest(c.v, coalesce((SELECT tq.finish_tag FROM rota.tenant_queues tq
                                   WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id),
                                  c.v))
    FROM unnest(p_queue_ids, p_tenant_ids) AS p(queue_id, tenant_id)
    JOIN clock c ON c.id = p.queue_id;
END
$$;

CREATE OR REPLACE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                p_tenant_ids integer[], p_costs double precision[],
                                p_priorities smallint[])
RETURNS void
-- Custom plans for large promotions: the arrays' sizes decide the joins (a
-- generic plan, which rota's sessions otherwise force, guesses them). Up to
-- 512 tasks the generic plans are as fast, and planning would cost a
-- one-task promotion more than running its statements does.
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_ids) <= 512 THEN
        -- Until the function returns (its SET clause restores the setting).
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT q, t FROM unnest(p_queue_ids, p_tenant_ids) AS x(q, t)) pairs;
    -- The pairs' tags stay locked until the transaction ends.
    PERFORM rota.lock_tags(v_pair_queues, v_pair_tenants);
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
    )
    UPDATE rota.tenant_queues tq SET finish_tag = m.finish, last_start = m.start
    FROM (SELECT queue_id, tenant_id, max(finish) AS finish, max(vtime) AS start
          FROM placed GROUP BY 1, 2) m
    WHERE tq.queue_id = m.queue_id AND tq.tenant_id = m.tenant_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(p_queue_ids)));
END
$$;

CREATE OR REPLACE FUNCTION rota.tasks_enter_line() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
    v_ran uuid[];
BEGIN
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

CREATE OR REPLACE FUNCTION rota.prune_loader_batches(p_older_than interval, p_keep integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH ranked AS (
        SELECT query, batch_id, part, loaded_at,
               dense_rank() OVER (PARTITION BY query ORDER BY batch_id DESC) AS nth
        FROM rota.loader_batches
    ), pruned AS (
        DELETE FROM rota.loader_batches b
        USING ranked r
        WHERE b.query = r.query AND b.batch_id = r.batch_id AND b.part = r.part
          AND r.nth > p_keep AND r.loaded_at < now() - p_older_than
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;
