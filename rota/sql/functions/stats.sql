-- The console's figures (rota/readmodel/): service per minute, the queues'
-- and tenants' counts and history, and their fair shares, counted by
-- maintenance duties rather than on the claim's path.

-- Counts what finished since the last count, up to a second before `p_now`
-- (a completion's row carries its transaction's start time, and commits
-- shortly after); keeps a day. Returns the completions counted. `p_now`,
-- here and in rota.refresh_stats, is the clock the history is counted by:
-- the transaction's time, or a caller's (a test's, which then stands at a
-- chosen moment instead of waiting for the wall clock's).
CREATE OR REPLACE FUNCTION rota.count_service(p_now timestamptz DEFAULT now()) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_from timestamptz;
    v_to timestamptz := p_now - interval '1 second';
    v_counted bigint;
BEGIN
    SELECT up_to INTO v_from FROM rota.service_counted FOR UPDATE;
    IF v_from IS NULL THEN
        v_from := v_to - interval '1 hour';
        INSERT INTO rota.service_counted (up_to) VALUES (v_from);
    END IF;
    IF v_to <= v_from THEN
        RETURN 0;
    END IF;
    WITH counts AS MATERIALIZED (
        SELECT date_trunc('minute', f.finished_at) AS minute, f.queue_id, f.tenant_id,
               count(*) AS completed,
               sum(greatest(0, extract(epoch FROM f.started_at - f.enqueued_at))) AS waits
        FROM rota.finished f
        WHERE f.finished_at > v_from AND f.finished_at <= v_to
        GROUP BY 1, 2, 3
    ), saved AS (
        INSERT INTO rota.service AS s (minute, queue_id, tenant_id, completed, wait_seconds)
        SELECT minute, queue_id, tenant_id, completed, waits FROM counts
        ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE
        SET completed = s.completed + excluded.completed,
            wait_seconds = s.wait_seconds + excluded.wait_seconds
    )
    SELECT coalesce(sum(completed), 0) INTO v_counted FROM counts;
    UPDATE rota.service_counted SET up_to = v_to;
    DELETE FROM rota.service WHERE minute < p_now - interval '1 day';
    RETURN v_counted;
END
$$;

-- Each queue's max-min fair level in a minute, into its history row: with
-- the minute's completions shared by water-filling over the tenants'
-- weights and demands (their completions in the minute and their
-- unfinished tasks as rota.stats counts them), a tenant is owed
-- least(demand, weight * level); infinity when every demand was met.
-- Tenants in ascending order of demand / weight: the largest prefix that the
-- completions satisfy whole leaves the rest to share by weight.
CREATE OR REPLACE FUNCTION rota.fair_levels(p_minute timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH d AS (
        SELECT queue_id, coalesce(v.completed, 0)::float8 AS completed,
               (coalesce(v.completed, 0)
                + coalesce(s.waiting + s.running + s.prefetched, 0))::float8 AS demand,
               t.weight
        FROM (SELECT queue_id, tenant_id, completed FROM rota.service
              WHERE minute = p_minute) v
        FULL JOIN (SELECT queue_id, tenant_id, waiting, running, prefetched FROM rota.stats
                   WHERE waiting + running + prefetched > 0) s USING (queue_id, tenant_id)
        JOIN rota.tenants t ON t.id = tenant_id
    ), totals AS (
        SELECT queue_id, sum(completed) AS served, sum(demand) AS asked, sum(weight) AS w_all
        FROM d GROUP BY 1
    ), ranked AS (
        SELECT queue_id, demand / weight AS r,
               sum(demand) OVER upto AS d_upto, sum(weight) OVER upto AS w_upto
        FROM d
        WINDOW upto AS (PARTITION BY queue_id ORDER BY demand / weight ROWS UNBOUNDED PRECEDING)
    ), levels AS (
        SELECT x.queue_id,
               CASE WHEN x.asked <= x.served THEN 'Infinity'::float8
                    ELSE coalesce((max(ARRAY[k.w_upto, (x.served - k.d_upto) / (x.w_all - k.w_upto)])
                                   FILTER (WHERE k.w_upto < x.w_all
                                             AND k.d_upto + k.r * (x.w_all - k.w_upto) <= x.served))[2],
                                  x.served / x.w_all)
               END AS level
        FROM totals x JOIN ranked k ON k.queue_id = x.queue_id
        GROUP BY x.queue_id, x.asked, x.served, x.w_all
    )
    UPDATE rota.queue_history h SET fair_level = l.level
    FROM levels l WHERE h.minute = p_minute AND h.queue_id = l.queue_id;
END
$$;

-- Recounts rota.stats from the queue tables, and writes the history of
-- `p_now`'s minute; returns the rows written to rota.stats.
CREATE OR REPLACE FUNCTION rota.refresh_stats(p_now timestamptz DEFAULT now()) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
    v_minute timestamptz := date_trunc('minute', p_now);
    v_last_minute boolean;
BEGIN
    -- One refresh at a time; a second caller leaves it to the first.
    IF NOT pg_try_advisory_xact_lock(hashtext('rota.refresh_stats')) THEN
        RETURN 0;
    END IF;
    -- The last minute is counted again, with its completions counted since
    -- its last refresh and the counts as they stand now (a moment after its
    -- end): at each refresh until one comes 2 seconds into this minute.
    -- rota.count_service counts up to a second before its call, so until
    -- then the last minute's final second is not all counted, and a level
    -- without it would owe the tenants the queue served to the last moment
    -- (a flood) less than they got.
    v_last_minute := (SELECT c.at FROM rota.stats_counted c) < v_minute + interval '2 seconds';
    -- Only what changed is written: rows of pairs with nothing left go,
    -- rows whose counts changed are updated, new pairs are inserted. A pair's
    -- unfinished tasks (in line or claimed) enter the history (rota.service)
    -- when they change, and hourly while they stay: readers carry the last
    -- record forward. While the last minute is counted again, a change is
    -- its record too: a minute's unfinished tasks are those its fair levels
    -- count (the counts now), not those of its last refresh, before the
    -- completions of its last moments.
    WITH counts (queue_id, tenant_id, waiting, running, scheduled, dead, first_vtime,
                 prefetched) AS (
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, min(vtime), 0
        FROM rota.ready GROUP BY 1, 2
        UNION ALL
        -- Parked (waiting for their key's room): waiting, not first in line.
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, NULL, 0
        FROM rota.parked GROUP BY 1, 2
        UNION ALL
        -- Claims: running, or claimed and not started (rota.claims).
        SELECT queue_id, tenant_id, 0, count(*) FILTER (WHERE running), 0, 0, NULL,
               count(*) FILTER (WHERE NOT running)
        FROM rota.claims GROUP BY 1, 2
        UNION ALL
        SELECT t.queue_id, t.tenant_id, 0, 0, count(*), 0, NULL, 0
        FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, 0, 0, count(*), NULL, 0
        FROM rota.tasks WHERE status = 'dead' GROUP BY 1, 2
    ), grouped AS (
        SELECT queue_id, tenant_id, sum(waiting) AS waiting, sum(running) AS running,
               sum(scheduled) AS scheduled, sum(dead) AS dead, min(first_vtime) AS first_vtime,
               sum(prefetched) AS prefetched
        FROM counts GROUP BY 1, 2
    ), diff AS MATERIALIZED (
        -- A full join is a hash or merge join: linear, whatever the
        -- estimates of a table that was empty when last analyzed.
        SELECT coalesce(g.queue_id, s.queue_id) AS queue_id,
               coalesce(g.tenant_id, s.tenant_id) AS tenant_id, s.ctid AS row_at,
               g.waiting, g.running, g.scheduled, g.dead, g.first_vtime, g.prefetched,
               -- Within a tenant and queue, line order is arrival order: its
               -- first task in line is its oldest waiting (an index probe),
               -- the same task while its place and the count in line stay.
               CASE WHEN g.first_vtime = s.first_vtime AND g.waiting = s.waiting
                    THEN s.oldest_enqueued_at
                    ELSE (SELECT t.enqueued_at
                          FROM rota.ready r JOIN rota.tasks t ON t.id = r.task_id
                          WHERE r.queue_id = g.queue_id AND r.vtime = g.first_vtime
                            AND r.tenant_id = g.tenant_id
                          ORDER BY r.seq LIMIT 1)
               END AS oldest_enqueued_at,
               g.queue_id IS NULL AS gone, s.queue_id IS NULL AS added,
               g.queue_id IS NOT NULL AND s.queue_id IS NOT NULL
                   AND ((g.waiting, g.running, g.scheduled, g.dead, g.first_vtime, g.prefetched)
                            IS DISTINCT FROM
                        (s.waiting, s.running, s.scheduled, s.dead, s.first_vtime, s.prefetched))
                   AS changed,
               coalesce(g.waiting + g.running + g.prefetched, 0) AS pending,
               CASE WHEN s.queue_id IS NULL THEN coalesce(g.waiting + g.running + g.prefetched, 0) > 0
                    WHEN g.queue_id IS NULL THEN s.waiting + s.running + s.prefetched > 0
                    ELSE g.waiting + g.running + g.prefetched <> s.waiting + s.running + s.prefetched
                         OR s.recorded_at < p_now - interval '1 hour'
                         OR (s.recorded_at IS NULL AND g.waiting + g.running + g.prefetched > 0)
               END AS record,
               s.recorded_at
        FROM grouped g FULL JOIN rota.stats s
            ON s.queue_id = g.queue_id AND s.tenant_id = g.tenant_id
    ), gone AS (
        DELETE FROM rota.stats WHERE ctid = ANY (ARRAY(SELECT row_at FROM diff WHERE gone))
    ), changed AS (
        UPDATE rota.stats s
        SET waiting = d.waiting, running = d.running, scheduled = d.scheduled, dead = d.dead,
            prefetched = d.prefetched, first_vtime = d.first_vtime, oldest_enqueued_at = d.oldest_enqueued_at,
            recorded_at = CASE WHEN d.record THEN p_now ELSE d.recorded_at END
        FROM diff d
        WHERE s.ctid = d.row_at AND (d.changed OR d.record) AND NOT d.gone
    ), added AS (
        INSERT INTO rota.stats (queue_id, tenant_id, waiting, running, scheduled, dead,
                                oldest_enqueued_at, recorded_at, first_vtime, prefetched)
        SELECT queue_id, tenant_id, waiting, running, scheduled, dead, oldest_enqueued_at,
               CASE WHEN record THEN p_now END, first_vtime, prefetched
        FROM diff WHERE added
    ), recorded AS (
        INSERT INTO rota.service AS v (minute, queue_id, tenant_id, completed, wait_seconds,
                                       pending)
        SELECT m.minute, d.queue_id, d.tenant_id, 0, 0, d.pending
        FROM diff d
        CROSS JOIN LATERAL (VALUES (v_minute), (v_minute - interval '1 minute')) m (minute)
        WHERE d.record AND (m.minute = v_minute OR v_last_minute)
        ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE SET pending = excluded.pending
    )
    SELECT count(*) INTO v_rows FROM grouped;
    INSERT INTO rota.stats_counted AS c (at) VALUES (p_now)
    ON CONFLICT (only_row) DO UPDATE SET at = excluded.at;
    -- The charts' history: this minute's row holds each gauge's last count
    -- in the minute and its largest; completions and deaths of this minute
    -- and the last are recounted (late commits land), the deaths by the
    -- partial index of dead tasks.
    INSERT INTO rota.queue_history AS h (minute, queue_id, waiting, running,
                                         oldest_wait_seconds, waiting_max, running_max,
                                         oldest_wait_max)
    SELECT v_minute, q.id, coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM p_now - s.oldest), coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM p_now - s.oldest)
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
    -- This minute's fair levels, from the counts now; a minute keeps those
    -- of its last refresh, and the refreshes of the next minute's first 2
    -- seconds compute them again from the same counts its record holds.
    IF v_last_minute THEN
        PERFORM rota.fair_levels(v_minute - interval '1 minute');
    END IF;
    PERFORM rota.fair_levels(v_minute);
    DELETE FROM rota.queue_history WHERE minute < p_now - interval '1 day';
    RETURN v_rows;
END
$$;

-- Some tenants' service per minute and queue in [p_since, p_until): the
-- completions and their summed waits, the demand (completions and the
-- unfinished tasks last recorded at or before the minute, carried forward
-- over minutes without a record), and the max-min fair share,
-- least(demand, weight now * the queue's fair level), NULL where no level
-- was kept. Every minute of a (tenant, queue) with a record in the window
-- or in the two hours before it (records come at least hourly).
CREATE OR REPLACE FUNCTION rota.tenant_minutes(p_tenants integer[], p_since timestamptz,
                                               p_until timestamptz)
RETURNS TABLE (minute timestamptz, tenant_id integer, queue_id integer, completed bigint,
               wait_seconds double precision, demand bigint, fair_share double precision)
LANGUAGE sql STABLE AS $$
    WITH kept AS (
        SELECT v.minute, v.tenant_id, v.queue_id, v.completed, v.wait_seconds, v.pending
        FROM rota.service v
        WHERE v.tenant_id = ANY (p_tenants)
          AND v.minute >= date_trunc('minute', p_since) - interval '2 hours'
          AND v.minute < p_until
    ), grid AS (
        SELECT m.minute, p.tenant_id, p.queue_id
        FROM (SELECT DISTINCT k.tenant_id, k.queue_id FROM kept k) p
        CROSS JOIN generate_series(date_trunc('minute', p_since) - interval '2 hours',
                                   p_until, interval '1 minute') m (minute)
        WHERE m.minute < p_until
    ), filled AS (
        SELECT g.minute, g.tenant_id, g.queue_id, coalesce(k.completed, 0) AS completed,
               coalesce(k.wait_seconds, 0) AS wait_seconds, k.pending,
               count(k.pending) OVER (PARTITION BY g.tenant_id, g.queue_id
                                      ORDER BY g.minute) AS records
        FROM grid g
        LEFT JOIN kept k
            ON k.minute = g.minute AND k.tenant_id = g.tenant_id AND k.queue_id = g.queue_id
    ), carried AS (
        SELECT f.minute, f.tenant_id, f.queue_id, f.completed, f.wait_seconds,
               f.completed + coalesce(max(f.pending) OVER (PARTITION BY f.tenant_id, f.queue_id,
                                                                        f.records), 0) AS demand
        FROM filled f
    )
    SELECT c.minute, c.tenant_id, c.queue_id, c.completed::bigint, c.wait_seconds, c.demand,
           CASE WHEN h.fair_level IS NOT NULL THEN least(c.demand, t.weight * h.fair_level) END
    FROM carried c
    JOIN rota.tenants t ON t.id = c.tenant_id
    LEFT JOIN rota.queue_history h ON h.minute = c.minute AND h.queue_id = c.queue_id
    WHERE c.minute >= p_since
$$;
