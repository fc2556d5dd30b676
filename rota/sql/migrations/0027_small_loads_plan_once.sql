-- rota 0027: a load of up to 512 tasks runs rota.enter_line's statements on
-- generic plans, planned once per session, instead of planning them on every
-- call: a one-task load spent 0.27 of its 0.65 ms in that function planning.

CREATE OR REPLACE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                p_tenant_ids integer[], p_costs double precision[],
                                p_priorities smallint[])
RETURNS void
-- Custom plans for large loads: the arrays' sizes decide the joins (a generic
-- plan, which rota's sessions otherwise force, guesses them). Up to 512 tasks
-- the generic plans are as fast, and planning would cost a one-task load
-- more than running its statements does.
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
