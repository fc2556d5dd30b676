-- rota 0021: loads put their tasks in line through a definer function that
-- computes the places (rota.enter_line_of); producers and loaders no longer
-- write places in line, the schedule or tenants' tags.

DROP FUNCTION rota.save_fair_tags(integer[], integer[], double precision[], integer[],
                                  double precision[]);

-- The transactions that put loaded tasks in line (rota.enter_line_of), so
-- that none does it twice: a second place in line for a task would make every
-- claim that meets it roll back. Unlogged: it matters only while those
-- transactions run.
CREATE UNLOGGED TABLE rota.lined (xact xid8 PRIMARY KEY);

-- Puts the tasks this transaction just loaded (COPY into rota.tasks) in line,
-- or on the schedule when their ETA is later: the places and tags computed
-- here (rota.enter_line), never by the caller. Only tasks loaded by this very
-- transaction (their loaded_at is its start) on their first attempt qualify,
-- and a transaction may call it once (rota.lined).
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
    -- Once per transaction: a second call fails on the key. Now and then,
    -- the rows of transactions that ended go.
    INSERT INTO rota.lined (xact) VALUES (pg_current_xact_id());
    IF random() < 0.01 THEN
        DELETE FROM rota.lined WHERE pg_xact_status(xact) IS DISTINCT FROM 'in progress';
    END IF;
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
