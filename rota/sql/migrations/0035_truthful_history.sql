-- rota 0035: the history keeps what operators need to read it truly. Each
-- queue's minute keeps its gauges' largest counts beside their last, and its
-- max-min fair level; each tenant's minute keeps its unfinished tasks (its
-- demand, with its completions); a succeeded task's record keeps its
-- attempts allowed and cost.

ALTER TABLE rota.queue_history
    ADD COLUMN waiting_max bigint,
    ADD COLUMN running_max bigint,
    ADD COLUMN oldest_wait_max double precision,
    ADD COLUMN fair_level double precision;
ALTER TABLE rota.service ADD COLUMN pending bigint;
ALTER TABLE rota.finished ADD COLUMN max_attempts integer, ADD COLUMN cost double precision;

CREATE OR REPLACE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key: a join on
    -- a function's result is estimated at 1000 rows and turns into a seq scan.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT r.task_id, r.queue_id, r.tenant_id, r.attempt, r.claimed_at, r.counted
        FROM rota.take_running(p_ids, p_attempts) r
    ), gone AS (
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT d.task_id FROM done d))
        RETURNING t.id, t.enqueued_at, t.max_attempts, t.cost
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                                   max_attempts, cost)
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at,
               g.max_attempts, g.cost
        FROM done d JOIN gone g ON g.id = d.task_id
        RETURNING task_id
    )
    SELECT s.task_id, d.counted FROM stored s JOIN done d ON d.task_id = s.task_id;
END
$$;

CREATE OR REPLACE FUNCTION rota.refresh_stats() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
    v_minute timestamptz := date_trunc('minute', now());
BEGIN
    -- One refresh at a time; a second caller leaves it to the first.
    IF NOT pg_try_advisory_xact_lock(hashtext('rota.refresh_stats')) THEN
        RETURN 0;
    END IF;
    DELETE FROM rota.stats;
    WITH counts (queue_id, tenant_id, waiting, running, scheduled, dead, first_vtime) AS (
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, min(vtime)
        FROM rota.ready GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, count(*), 0, 0, NULL FROM rota.running GROUP BY 1, 2
        UNION ALL
        SELECT t.queue_id, t.tenant_id, 0, 0, count(*), 0, NULL
        FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, 0, 0, count(*), NULL
        FROM rota.tasks WHERE status = 'dead' GROUP BY 1, 2
    ), grouped AS (
        SELECT queue_id, tenant_id, sum(waiting) AS waiting, sum(running) AS running,
               sum(scheduled) AS scheduled, sum(dead) AS dead, min(first_vtime) AS first_vtime
        FROM counts GROUP BY 1, 2
    )
    INSERT INTO rota.stats
    SELECT g.queue_id, g.tenant_id, g.waiting, g.running, g.scheduled, g.dead,
           -- Within a tenant and queue, line order is arrival order: its
           -- first task in line is its oldest waiting (an index probe).
           (SELECT t.enqueued_at
            FROM rota.ready r JOIN rota.tasks t ON t.id = r.task_id
            WHERE r.queue_id = g.queue_id AND r.vtime = g.first_vtime
              AND r.tenant_id = g.tenant_id
            ORDER BY r.seq LIMIT 1),
           now()
    FROM grouped g;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    -- The charts' history: this minute's row holds each gauge's last count
    -- in the minute and its largest; completions and deaths of this minute
    -- and the last are recounted (late commits land), the deaths by the
    -- partial index of dead tasks.
    INSERT INTO rota.queue_history AS h (minute, queue_id, waiting, running,
                                         oldest_wait_seconds, waiting_max, running_max,
                                         oldest_wait_max)
    SELECT v_minute, q.id, coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest), coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest)
    FROM rota.queues q
    LEFT JOIN (SELECT queue_id, sum(waiting) AS waiting, sum(running) AS running,
                      min(oldest_enqueued_at) AS oldest
               FROM rota.stats GROUP BY queue_id) s ON s.queue_id = q.id
    ON CONFLICT (minute, queue_id) DO UPDATE
    SET waiting = excluded.waiting, running = excluded.running,
        oldest_wait_seconds = excluded.oldest_wait_seconds,
        waiting_max = greatest(h.waiting_max, excluded.waiting_max),
        running_max = greatest(h.running_max, excluded.running_max),
        oldest_wait_max = greatest(h.oldest_wait_max, excluded.oldest_wait_max);
    UPDATE rota.queue_history h
    SET completed = coalesce(v.completed, 0), died = coalesce(d.died, 0)
    FROM rota.queue_history x
    LEFT JOIN (SELECT minute, queue_id, sum(completed) AS completed FROM rota.service
               WHERE minute >= v_minute - interval '1 minute' GROUP BY 1, 2) v
        ON v.minute = x.minute AND v.queue_id = x.queue_id
    LEFT JOIN (SELECT date_trunc('minute', finished_at) AS minute, queue_id, count(*) AS died
               FROM rota.tasks
               WHERE status = 'dead' AND finished_at >= v_minute - interval '1 minute'
               GROUP BY 1, 2) d
        ON d.minute = x.minute AND d.queue_id = x.queue_id
    WHERE x.minute >= v_minute - interval '1 minute'
      AND h.minute = x.minute AND h.queue_id = x.queue_id;
    -- Each tenant's unfinished tasks (in line or claimed) at this minute's
    -- last count: with its completions in the minute, what it asked for in
    -- it (its demand). Only tenants with unfinished tasks get a row beyond
    -- those served.
    UPDATE rota.service v SET pending = 0
    WHERE v.minute = v_minute AND v.pending > 0
      AND NOT EXISTS (SELECT 1 FROM rota.stats s
                      WHERE s.queue_id = v.queue_id AND s.tenant_id = v.tenant_id
                        AND s.waiting + s.running > 0);
    INSERT INTO rota.service AS v (minute, queue_id, tenant_id, completed, wait_seconds, pending)
    SELECT v_minute, s.queue_id, s.tenant_id, 0, 0, s.waiting + s.running
    FROM rota.stats s WHERE s.waiting + s.running > 0
    ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE SET pending = excluded.pending
    WHERE v.pending IS DISTINCT FROM excluded.pending;
    -- Each queue's max-min fair level in this minute and the last: with
    -- the minute's completions shared by water-filling over the tenants'
    -- weights and demands, a tenant is owed least(demand, weight * level);
    -- infinity when every demand was met. Tenants in ascending order of
    -- demand / weight: the largest prefix that the completions satisfy whole
    -- leaves the rest to share by weight.
    WITH d AS (
        SELECT v.minute, v.queue_id, v.completed::float8 AS completed,
               (v.completed + coalesce(v.pending, 0))::float8 AS demand, t.weight
        FROM rota.service v JOIN rota.tenants t ON t.id = v.tenant_id
        WHERE v.minute >= v_minute - interval '1 minute'
    ), ranked AS (
        SELECT minute, queue_id, demand / weight AS r,
               sum(demand) OVER upto AS d_upto, sum(weight) OVER upto AS w_upto,
               sum(completed) OVER whole AS served, sum(demand) OVER whole AS asked,
               sum(weight) OVER whole AS w_all
        FROM d
        WINDOW upto AS (PARTITION BY minute, queue_id ORDER BY demand / weight
                        ROWS UNBOUNDED PRECEDING),
               whole AS (PARTITION BY minute, queue_id)
    ), levels AS (
        SELECT minute, queue_id,
               CASE WHEN max(asked) <= max(served) THEN 'Infinity'::float8
                    ELSE coalesce((array_agg((served - d_upto) / nullif(w_all - w_upto, 0)
                                             ORDER BY w_upto DESC)
                                   FILTER (WHERE d_upto + r * (w_all - w_upto) <= served))[1],
                                  max(served) / max(w_all))
               END AS level
        FROM ranked GROUP BY 1, 2
    )
    UPDATE rota.queue_history h SET fair_level = l.level
    FROM levels l WHERE h.minute = l.minute AND h.queue_id = l.queue_id;
    DELETE FROM rota.queue_history WHERE minute < now() - interval '1 day';
    RETURN v_rows;
END
$$;
