-- rota 0005: tasks are COPY'd straight into rota.tasks (each written once, not
-- staged and copied again): load_begin and load_copied replace load_staged.

DROP FUNCTION rota.load_staged();

-- Loading a batch takes three steps in one transaction (rota.ops.load):
-- rota.load_begin, a COPY straight into rota.tasks, and rota.load_copied.
-- COPY writes each task once; the fair tags are given after it, under the
-- queue locks that load_begin took before it, so tags follow arrival order.

-- Creates the batch's unknown queues and tenants (in name order, so that
-- loaders creating the same ones cannot deadlock), locks its queues, and
-- returns the ids of the names, in the order given, and which of the task ids
-- already succeeded (in rota.finished: a batch loaded again must not bring
-- them back).
CREATE FUNCTION rota.load_begin(p_queues text[], p_tenants text[], p_ids uuid[])
RETURNS TABLE (queue_ids integer[], tenant_ids integer[], finished_ids uuid[])
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.queues (name)
    SELECT DISTINCT n FROM unnest(p_queues) n
    WHERE NOT EXISTS (SELECT 1 FROM rota.queues q WHERE q.name = n)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO rota.tenants (name)
    SELECT DISTINCT n FROM unnest(p_tenants) n
    WHERE NOT EXISTS (SELECT 1 FROM rota.tenants t WHERE t.name = n)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    RETURN QUERY
    WITH locked AS MATERIALIZED (
        SELECT q.id, q.name FROM rota.queues q WHERE q.name = ANY (p_queues) ORDER BY q.id FOR UPDATE
    )
    SELECT ARRAY(SELECT l.id FROM unnest(p_queues) WITH ORDINALITY n(name, i)
                 JOIN locked l ON l.name = n.name ORDER BY n.i),
           ARRAY(SELECT t.id FROM unnest(p_tenants) WITH ORDINALITY n(name, i)
                 JOIN rota.tenants t ON t.name = n.name ORDER BY n.i),
           ARRAY(SELECT f.task_id FROM rota.finished f WHERE f.task_id = ANY (p_ids));
END
$$;

-- Finishes loading the tasks just COPY'd into rota.tasks: those with an ETA
-- still ahead wait as scheduled, the others get their fair place in line.
-- p_eta_ids names the tasks that have an ETA at all. Returns how many were loaded.
CREATE FUNCTION rota.load_copied(p_ids uuid[], p_eta_ids uuid[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[]; v_seqs bigint[]; v_qids integer[]; v_tids integer[]; v_costs double precision[];
BEGIN
    IF cardinality(p_eta_ids) > 0 THEN
        WITH later AS (
            UPDATE rota.tasks t SET status = 'scheduled'
            WHERE t.id = ANY (p_eta_ids) AND t.eta > now()
            RETURNING t.id, t.eta
        )
        INSERT INTO rota.scheduled (run_at, task_id) SELECT eta, id FROM later;
    END IF;
    SELECT array_agg(id), array_agg(seq), array_agg(queue_id), array_agg(tenant_id), array_agg(cost)
    INTO v_ids, v_seqs, v_qids, v_tids, v_costs
    FROM (SELECT t.id, t.seq, t.queue_id, t.tenant_id, t.cost FROM rota.tasks t
          WHERE t.id = ANY (p_ids) AND t.status = 'pending' ORDER BY t.seq) copied;
    IF v_ids IS NOT NULL THEN
        PERFORM rota.make_ready(v_ids, v_seqs, v_qids, v_tids, v_costs);
    END IF;
    RETURN cardinality(p_ids);
END
$$;
