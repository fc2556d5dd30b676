-- rota 0021: loads put their tasks in line through a definer function that
-- computes the places (rota.enter_line_of); producers and loaders no longer
-- write places in line, the schedule or tenants' tags.

DROP FUNCTION rota.save_fair_tags(integer[], integer[], double precision[], integer[],
                                  double precision[]);

-- How far each transaction that loads has put its tasks in line
-- (rota.enter_line_of): the largest arrival number (seq) done. A task at or
-- below it is not put in line again: a second place in line for a task would
-- make every claim that meets it roll back. A transaction's loads number
-- their tasks in increasing order, so several loads in one transaction (a
-- Spark micro-batch's chunks, enqueues in the caller's transaction) each
-- put their own tasks in line. Unlogged: it matters only while those
-- transactions run.
CREATE UNLOGGED TABLE rota.lined (xact xid8 PRIMARY KEY, seq bigint NOT NULL);

-- Puts the tasks this transaction just loaded (COPY into rota.tasks) in line,
-- or on the schedule when their ETA is later: the places and tags computed
-- here (rota.enter_line), never by the caller. Only tasks loaded by this very
-- transaction (their loaded_at is its start) on their first attempt and not
-- yet put in line by it (rota.lined) qualify.
CREATE FUNCTION rota.enter_line_of(p_ids uuid[]) RETURNS void
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
BEGIN
    SELECT l.seq INTO v_after FROM rota.lined l WHERE l.xact = pg_current_xact_id();
    WITH fresh AS MATERIALIZED (
        SELECT t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.status, t.eta
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
           array_agg(f.cost ORDER BY f.seq) FILTER (WHERE f.status = 'pending')
    INTO v_last, v_ids, v_seqs, v_queues, v_tenants, v_costs
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
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs);
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
