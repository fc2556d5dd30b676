-- rota 0019: loads and promotions through definer functions that compute the
-- fair tags themselves (rota.load_tasks, rota.promote_due); callers keep no
-- right to write tasks, places in line or tags.

DROP FUNCTION rota.save_fair_tags(integer[], integer[], double precision[], integer[],
                                  double precision[]);

-- Makes tasks just inserted or promoted claimable at their fair places
-- (start-time fair queueing, docs/architecture.md): each (queue, tenant)
-- pair's tasks, in arrival (seq) order, start at S = max(V, F), the queue's
-- virtual clock or the tenant's finish tag, and move F on by cost / weight.
-- Saves each pair's finish tag and each queue's largest start tag, and
-- notifies each queue once. Called only by rota's definer functions: the tags
-- come from these rules, never from a caller.
CREATE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                p_tenant_ids integer[], p_costs double precision[])
RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
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
        SELECT x.queue_id, x.tenant_id, x.seq, x.id,
               s.start + sum(x.cost / s.weight) OVER w - x.cost / s.weight AS vtime,
               s.start + sum(x.cost / s.weight) OVER w AS finish
        FROM unnest(p_ids, p_seqs, p_queue_ids, p_tenant_ids, p_costs)
             AS x(id, seq, queue_id, tenant_id, cost)
        JOIN starts s ON s.queue_id = x.queue_id AND s.tenant_id = x.tenant_id
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq
                     ROWS UNBOUNDED PRECEDING)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id)
        SELECT queue_id, vtime, tenant_id, seq, id FROM placed
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

-- Loads tasks (producers' fallback, loaders, cron): each new one into
-- rota.tasks, scheduled when its ETA is later, else in line (rota.enter_line).
-- Ids seen before (waiting, running or finished) are skipped: a batch loaded
-- again changes nothing. Queue and tenant names get ids on first sight.
-- Returns how many tasks were new. The callers hold no right on the tables:
-- the columns are checked by the tables' constraints, the places in line are
-- this function's.
CREATE FUNCTION rota.load_tasks(
    p_ids uuid[], p_queues text[], p_tenants text[], p_names text[], p_payloads text[],
    p_costs double precision[], p_max_attempts integer[], p_backoff_bases double precision[],
    p_backoff_maxes double precision[], p_etas timestamptz[], p_enqueued_ats timestamptz[]
) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
    v_queues text[] := ARRAY(SELECT DISTINCT unnest(p_queues) ORDER BY 1);
    v_tenants text[] := ARRAY(SELECT DISTINCT unnest(p_tenants) ORDER BY 1);
    v_queue_ids integer[];
    v_tenant_ids integer[];
    v_seqs bigint[];
    v_new integer;
    v_ids uuid[];
    v_ready_seqs bigint[];
    v_ready_queues integer[];
    v_ready_tenants integer[];
    v_costs double precision[];
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    SELECT n.queue_ids, n.tenant_ids INTO v_queue_ids, v_tenant_ids
    FROM rota.name_ids(v_queues, v_tenants) n;
    v_seqs := ARRAY(SELECT nextval('rota.task_seq') FROM generate_series(1, cardinality(p_ids))
                    ORDER BY 1);
    WITH input AS (
        SELECT x.*, v_seqs[x.i] AS seq, q.id AS queue_id, t.id AS tenant_id
        FROM unnest(p_ids, p_queues, p_tenants, p_names, p_payloads, p_costs, p_max_attempts,
                    p_backoff_bases, p_backoff_maxes, p_etas, p_enqueued_ats)
             WITH ORDINALITY AS x(id, queue, tenant, name, payload, cost, max_attempts,
                                  backoff_base, backoff_max, eta, enqueued_at, i)
        JOIN unnest(v_queues, v_queue_ids) AS q(name, id) ON q.name = x.queue
        JOIN unnest(v_tenants, v_tenant_ids) AS t(name, id) ON t.name = x.tenant
        WHERE NOT EXISTS (SELECT FROM rota.finished f WHERE f.task_id = x.id)
    ), inserted AS (
        INSERT INTO rota.tasks (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts,
                                backoff_base, backoff_max, status, eta, enqueued_at, tenant)
        SELECT id, seq, queue_id, tenant_id, name, payload::json, cost, max_attempts,
               backoff_base, backoff_max,
               (CASE WHEN eta > now() THEN 'scheduled' ELSE 'pending' END)::rota.task_status,
               eta, enqueued_at, tenant
        FROM input
        ON CONFLICT (id) DO NOTHING
        RETURNING id, seq, queue_id, tenant_id, cost, eta
    ), scheduled AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT eta, id FROM inserted WHERE eta > now()
    )
    SELECT count(*)::integer,
           array_agg(id ORDER BY seq) FILTER (WHERE eta IS NULL OR eta <= now()),
           array_agg(seq ORDER BY seq) FILTER (WHERE eta IS NULL OR eta <= now()),
           array_agg(queue_id ORDER BY seq) FILTER (WHERE eta IS NULL OR eta <= now()),
           array_agg(tenant_id ORDER BY seq) FILTER (WHERE eta IS NULL OR eta <= now()),
           array_agg(cost ORDER BY seq) FILTER (WHERE eta IS NULL OR eta <= now())
    INTO v_new, v_ids, v_ready_seqs, v_ready_queues, v_ready_tenants, v_costs
    FROM inserted;
    PERFORM rota.enter_line(v_ids, v_ready_seqs, v_ready_queues, v_ready_tenants, v_costs);
    RETURN v_new;
END
$$;

-- Moves due scheduled tasks (ETA reached, retry backoff over) into line, in
-- one transaction with their removal from the schedule.
CREATE FUNCTION rota.promote_due(p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids uuid[];
    v_seqs bigint[];
    v_queues integer[];
    v_tenants integer[];
    v_costs double precision[];
BEGIN
    SELECT array_agg(d.id ORDER BY d.seq), array_agg(d.seq ORDER BY d.seq),
           array_agg(d.queue_id ORDER BY d.seq), array_agg(d.tenant_id ORDER BY d.seq),
           array_agg(d.cost ORDER BY d.seq)
    INTO v_ids, v_seqs, v_queues, v_tenants, v_costs
    FROM rota.take_due(least(greatest(p_limit, 1), 100000)) d;
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs);
    RETURN coalesce(cardinality(v_ids), 0);
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
