-- rota 0023: the history the console's charts draw. Each queue's backlog,
-- oldest wait, completions and deaths per minute (rota.queue_history),
-- written by the maintenance duty that counts rota.stats; and an index that
-- reads one tenant's service per minute without the other tenants'.

-- Per minute and queue: the figures of rota.stats as last counted in that
-- minute, and the completions (rota.service) and deaths in it. A day is kept.
CREATE TABLE rota.queue_history (
    minute timestamptz NOT NULL,
    queue_id integer NOT NULL,
    waiting bigint NOT NULL,
    running bigint NOT NULL,
    oldest_wait_seconds double precision,
    completed bigint NOT NULL DEFAULT 0,
    died bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue_id)
);
CREATE INDEX service_tenant_minute ON rota.service (tenant_id, minute);

-- Recounts rota.stats from the queue tables, and writes this minute's
-- history; returns the rows written to rota.stats.
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
    -- The charts' history: this minute's row holds the minute's last count;
    -- completions and deaths of this minute and the last are recounted (late
    -- commits land), the deaths by the partial index of dead tasks.
    INSERT INTO rota.queue_history AS h (minute, queue_id, waiting, running,
                                         oldest_wait_seconds)
    SELECT v_minute, q.id, coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest)
    FROM rota.queues q
    LEFT JOIN (SELECT queue_id, sum(waiting) AS waiting, sum(running) AS running,
                      min(oldest_enqueued_at) AS oldest
               FROM rota.stats GROUP BY queue_id) s ON s.queue_id = q.id
    ON CONFLICT (minute, queue_id) DO UPDATE
    SET waiting = excluded.waiting, running = excluded.running,
        oldest_wait_seconds = excluded.oldest_wait_seconds;
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
    DELETE FROM rota.queue_history WHERE minute < now() - interval '1 day';
    RETURN v_rows;
END
$$;
