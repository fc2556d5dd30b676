-- rota 0028: tasks go in line from a trigger on their insert, reading the
-- statement's new rows (its transition table), instead of from a call after
-- the COPY that read them back by id: the read-back cost a bulk load 1-2 us a
-- task and a one-task load a round trip. rota.lined (how far each
-- transaction's loads had been put in line) is no longer needed.

DROP TABLE rota.lined;

-- Puts the tasks an INSERT or COPY into rota.tasks stored in line, or on the
-- schedule when their ETA is later: the places and tags computed here by
-- rota.enter_line's rules, never by the caller. A row is inserted once, so it is
-- put in line once: a second place in line for a task would make every claim
-- that meets it roll back. Only tasks on their first attempt qualify. The
-- statement's new rows come from its transition table: nothing is read back.
CREATE FUNCTION rota.tasks_enter_line() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
BEGIN
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
    ), tags AS (
        INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
        SELECT queue_id, tenant_id, max(finish) FROM placed GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = excluded.finish_tag
    )
    UPDATE rota.queues q SET max_start = greatest(q.max_start, m.s)
    FROM (SELECT queue_id, max(vtime) AS s FROM placed GROUP BY 1) m
    WHERE q.id = m.queue_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(v_pair_queues)));
    RETURN NULL;
END
$$;

CREATE TRIGGER enter_line AFTER INSERT ON rota.tasks
    REFERENCING NEW TABLE AS loaded
    FOR EACH STATEMENT EXECUTE FUNCTION rota.tasks_enter_line();

-- Loaders of rota before migration 0028 call this after their COPY; the
-- insert trigger (rota.tasks_enter_line) has put those tasks in line already.
CREATE OR REPLACE FUNCTION rota.enter_line_of(p_ids uuid[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ SELECT $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
