-- rota 0040: queues charged by measured run time. Workers record their runs'
-- seconds; in such a queue each task costs its tenant's measured seconds per
-- run, so that tenants of equal weight get equal shares of worker time.

ALTER TABLE rota.queues ADD COLUMN charge_time boolean NOT NULL DEFAULT false,
    ADD COLUMN run_seconds double precision;
ALTER TABLE rota.tenant_queues ADD COLUMN run_seconds double precision;

CREATE OR REPLACE FUNCTION rota.fair_starts(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS TABLE (queue_id integer, tenant_id integer, weight double precision,
               start double precision)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v, q.charge_time, q.run_seconds
        FROM (SELECT DISTINCT unnest(p_queue_ids) AS id) x JOIN rota.queues q ON q.id = x.id
    )
    SELECT p.queue_id, p.tenant_id,
           -- Charged by time, a task costs its pair's seconds per run: the
           -- weight is divided by them (placement divides cost by weight).
           (SELECT t.weight FROM rota.tenants t WHERE t.id = p.tenant_id)
               / CASE WHEN c.charge_time
                      THEN greatest(coalesce((SELECT tq.run_seconds FROM rota.tenant_queues tq
                                              WHERE tq.queue_id = p.queue_id
                                                AND tq.tenant_id = p.tenant_id),
                                             c.run_seconds, 1), 1e-6)
                      ELSE 1 END,
           greatest(c.v, coalesce((SELECT tq.finish_tag FROM rota.tenant_queues tq
                                   WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id),
                                  c.v))
    FROM unnest(p_queue_ids, p_tenant_ids) AS p(queue_id, tenant_id)
    JOIN clock c ON c.id = p.queue_id;
END
$$;
ALTER FUNCTION rota.fair_starts(integer[], integer[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Records measured run times (a worker's, each heartbeat): per queue and
-- tenant, runs and their seconds. In queues charged by time they move the
-- pair's and the queue's seconds per run (a mean over about the last ten
-- runs), which the next loads' places are costed with. A pair measured for
-- the first time, or whose mean more than doubled or halved, has its waiting
-- tasks placed again at the new cost (from its first one on, in their
-- order): a backlog loaded before it was measured does not keep a wrong
-- share. Rows are locked in key order, as loads lock them.
CREATE FUNCTION rota.record_run_times(p_queues text[], p_tenants text[], p_runs integer[],
                                      p_seconds double precision[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queues integer[];
    v_tenants integer[];
    v_steps double precision[];
BEGIN
    WITH given AS MATERIALIZED (
        SELECT q.id AS queue_id, t.id AS tenant_id, t.weight, x.runs, x.seconds
        FROM unnest(p_queues, p_tenants, p_runs, p_seconds) AS x(queue, tenant, runs, seconds)
        JOIN rota.queues q ON q.name = x.queue AND q.charge_time
        JOIN rota.tenants t ON t.name = x.tenant
        WHERE x.runs > 0 AND x.seconds >= 0
    ), locked AS MATERIALIZED (
        SELECT tq.queue_id, tq.tenant_id, tq.run_seconds AS before FROM rota.tenant_queues tq
        JOIN given g ON g.queue_id = tq.queue_id AND g.tenant_id = tq.tenant_id
        ORDER BY tq.queue_id, tq.tenant_id FOR UPDATE OF tq
    ), pairs AS (
        UPDATE rota.tenant_queues tq
        SET run_seconds = CASE WHEN tq.run_seconds IS NULL THEN g.seconds / g.runs
                               ELSE tq.run_seconds
                                    + (g.seconds / g.runs - tq.run_seconds) * g.runs / (g.runs + 10.0)
                          END
        FROM given g JOIN locked l ON l.queue_id = g.queue_id AND l.tenant_id = g.tenant_id
        WHERE tq.queue_id = g.queue_id AND tq.tenant_id = g.tenant_id
        RETURNING tq.queue_id, tq.tenant_id, tq.run_seconds, l.before, g.weight
    ), queues AS (
        UPDATE rota.queues q
        SET run_seconds = CASE WHEN q.run_seconds IS NULL THEN a.seconds / a.runs
                               ELSE q.run_seconds
                                    + (a.seconds / a.runs - q.run_seconds) * a.runs / (a.runs + 10.0)
                          END
        FROM (SELECT g.queue_id, sum(g.runs) AS runs, sum(g.seconds) AS seconds
              FROM given g GROUP BY g.queue_id) a
        WHERE q.id = a.queue_id
    )
    SELECT array_agg(p.queue_id), array_agg(p.tenant_id),
           array_agg(greatest(p.run_seconds, 1e-6) / p.weight)
    INTO v_queues, v_tenants, v_steps
    FROM pairs p
    WHERE p.before IS NULL OR p.run_seconds > 2 * p.before OR p.run_seconds < p.before / 2;
    IF v_queues IS NULL THEN
        RETURN;
    END IF;
    -- Placed again one run's cost apart (a declared cost of 1 each).
    WITH moved AS (
        SELECT * FROM unnest(v_queues, v_tenants, v_steps) AS m(queue_id, tenant_id, step)
    ), ordered AS MATERIALIZED (
        SELECT r.ctid AS row_id, r.queue_id, r.tenant_id, m.step,
               first_value(r.vtime) OVER w AS first, row_number() OVER w - 1 AS n
        FROM rota.ready r JOIN moved m ON m.queue_id = r.queue_id AND m.tenant_id = r.tenant_id
        WINDOW w AS (PARTITION BY r.queue_id, r.tenant_id ORDER BY r.vtime, r.seq)
    ), placed AS (
        UPDATE rota.ready r SET vtime = o.first + o.n * o.step
        FROM ordered o WHERE r.ctid = o.row_id
        RETURNING r.queue_id, r.tenant_id, r.vtime
    )
    UPDATE rota.tenant_queues tq SET finish_tag = p.last + m.step
    FROM (SELECT queue_id, tenant_id, max(vtime) AS last FROM placed GROUP BY 1, 2) p
    JOIN moved m ON m.queue_id = p.queue_id AND m.tenant_id = p.tenant_id
    WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id;
END
$$;

-- Charges a queue's tenants by measured run time (p_charge), or by declared
-- cost alone; false if there is no such queue.
CREATE FUNCTION rota.charge_queue(p_name text, p_charge_time boolean, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.queues SET charge_time = p_charge_time WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_charge_time THEN 'charge by time' ELSE 'charge by cost' END,
            'queue:' || p_name, 1);
    RETURN true;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
