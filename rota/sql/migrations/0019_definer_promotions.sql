-- rota 0019: promotions through a definer function that computes the fair
-- places itself (rota.promote_due, rota.enter_line), in one transaction with
-- the schedule.

-- Makes tasks just promoted claimable at their fair places
-- (start-time fair queueing, docs/architecture.md): each (queue, tenant)
-- pair's tasks, in arrival (seq) order, start at S = max(V, F), the queue's
-- virtual clock or the tenant's finish tag, and move F on by cost / weight.
-- Saves each pair's finish tag and each queue's largest start tag, and
-- notifies each queue once. Called only by rota's definer functions: the tags
-- come from these rules, never from a caller.
CREATE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                p_tenant_ids integer[], p_costs double precision[])
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
