-- rota 0021: loads put their tasks in line through a definer function that
-- computes the places (rota.enter_line_of); producers and loaders no longer
-- write places in line, the schedule or tenants' tags.

DROP FUNCTION rota.save_fair_tags(integer[], integer[], double precision[], integer[],
                                  double precision[]);

-- A task has one place in line: a second one (say, a credential that could
-- insert places) would make every claim that meets it roll back.
CREATE UNIQUE INDEX ready_task ON rota.ready (task_id);

-- Puts the tasks this transaction just loaded (COPY into rota.tasks) in line,
-- or on the schedule when their ETA is later: the places and tags computed
-- here (rota.enter_line), never by the caller. Only tasks loaded by this very
-- transaction (their loaded_at is its start) on their first attempt qualify;
-- a second call for the same task meets ready_task and fails.
CREATE FUNCTION rota.enter_line_of(p_ids uuid[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
    v_ids uuid[];
    v_seqs bigint[];
    v_queues integer[];
    v_tenants integer[];
    v_costs double precision[];
BEGIN
    WITH fresh AS MATERIALIZED (
        SELECT t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.status, t.eta
        FROM rota.tasks t
        WHERE t.id = ANY (p_ids) AND t.loaded_at = now() AND t.attempts = 0
          AND t.status IN ('pending', 'scheduled')
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT coalesce(f.eta, now()), f.id FROM fresh f WHERE f.status = 'scheduled'
    )
    SELECT array_agg(f.id ORDER BY f.seq), array_agg(f.seq ORDER BY f.seq),
           array_agg(f.queue_id ORDER BY f.seq), array_agg(f.tenant_id ORDER BY f.seq),
           array_agg(f.cost ORDER BY f.seq)
    INTO v_ids, v_seqs, v_queues, v_tenants, v_costs
    FROM fresh f WHERE f.status = 'pending';
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs);
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
