-- rota 0030: a batch loaded again brings back no task that has run, even one
-- that finished while the load inserted its row: the insert waited on the
-- row's deletion, then stored it again, as the load had looked at
-- rota.finished before. The insert trigger looks again after the insert and
-- deletes such rows.

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

