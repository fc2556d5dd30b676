-- The read model: what operators and scripts see.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: task_state
SELECT t.id, q.name AS queue, tn.name AS tenant,
       CASE WHEN r.task_id IS NOT NULL THEN 'running' ELSE t.status::text END AS status,
       t.attempts, t.last_error, t.finished_at, t.priority
FROM rota.tasks t
JOIN rota.queues q ON q.id = t.queue_id
JOIN rota.tenants tn ON tn.id = t.tenant_id
LEFT JOIN rota.running r ON r.task_id = t.id
WHERE t.id = ANY (%(ids)b::uuid[])
UNION ALL
SELECT f.task_id, q.name, tn.name, 'succeeded', f.attempts, NULL, f.finished_at, NULL
FROM rota.finished f
JOIN rota.queues q ON q.id = f.queue_id
JOIN rota.tenants tn ON tn.id = f.tenant_id
WHERE f.task_id = ANY (%(ids)b::uuid[])

-- name: queue_counts
SELECT q.name AS queue,
       (SELECT count(*) FROM rota.ready r WHERE r.queue_id = q.id) AS ready,
       (SELECT count(*) FROM rota.running r WHERE r.queue_id = q.id) AS running,
       (SELECT count(*) FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id
        WHERE t.queue_id = q.id) AS scheduled,
       -- Waiting for their key's room (rota.key_admit), out of the line.
       (SELECT count(*) FROM rota.parked p WHERE p.queue_id = q.id) AS parked
FROM rota.queues q
ORDER BY q.name

-- name: overview_queues
-- Per queue: the figures of rota.stats (refreshed by maintenance; `at` says
-- when), and completions per minute over the last five minutes. Running and
-- prefetched: its claims, as rota.claims tells them apart.
SELECT q.name, q.paused,
       coalesce(s.waiting, 0) AS waiting, coalesce(s.running, 0) AS running,
       coalesce(s.scheduled, 0) AS scheduled, coalesce(s.dead, 0) AS dead,
       coalesce(v.completed, 0) / 5.0 AS per_minute,
       extract(epoch FROM now() - s.oldest) AS oldest_wait_seconds,
       (SELECT c.at FROM rota.stats_counted c) AS counted_at,
       coalesce(s.prefetched, 0) AS prefetched
FROM rota.queues q
LEFT JOIN (
    SELECT queue_id, sum(waiting) AS waiting, sum(running) AS running,
           sum(prefetched) AS prefetched, sum(scheduled) AS scheduled, sum(dead) AS dead,
           min(oldest_enqueued_at) AS oldest
    FROM rota.stats GROUP BY queue_id
) s ON s.queue_id = q.id
LEFT JOIN (
    SELECT queue_id, sum(completed) AS completed
    FROM rota.service WHERE minute >= now() - interval '5 minutes' GROUP BY queue_id
) v ON v.queue_id = q.id
ORDER BY q.name

-- name: tenant_rows
-- Every tenant with its figures (rota.stats), filtered by a name prefix;
-- sorted and paged by the caller's choice among fixed keys. `served` (a
-- sort key: the figures shown are rota.core.history.fair_shares') counts
-- the completions of the last `minutes` whole minutes, its window.
WITH s AS (
    SELECT tenant_id, sum(waiting) AS waiting, sum(running) AS running,
           sum(prefetched) AS prefetched, sum(scheduled) AS scheduled, sum(dead) AS dead,
           min(oldest_enqueued_at) AS oldest
    FROM rota.stats GROUP BY tenant_id
), served AS (
    SELECT tenant_id, sum(completed) AS completed
    FROM rota.service
    WHERE minute >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
      AND minute < date_trunc('minute', now())
    GROUP BY tenant_id
), rows AS (
    SELECT t.name, t.weight, t.paused, coalesce(s.waiting, 0) AS waiting,
           coalesce(s.running, 0) AS running, coalesce(s.prefetched, 0) AS prefetched,
           coalesce(s.running + s.prefetched, 0) AS claimed, t.concurrency_limit, t.rate_limit,
           rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) AS tokens,
           t.capacity, coalesce(s.scheduled, 0) AS scheduled, coalesce(s.dead, 0) AS dead,
           extract(epoch FROM now() - s.oldest) AS oldest_wait_seconds,
           coalesce(v.completed, 0) AS served
    FROM rota.tenants t
    LEFT JOIN s ON s.tenant_id = t.id
    LEFT JOIN served v ON v.tenant_id = t.id
    WHERE t.name LIKE %(prefix)s || '%%'
)
SELECT *, count(*) OVER () AS total
FROM rows
ORDER BY
    CASE WHEN %(sort)s = 'name' AND %(descending)s THEN name END DESC,
    CASE WHEN %(sort)s = 'name' THEN name END,
    CASE %(sort)s
        WHEN 'waiting' THEN waiting::float8
        WHEN 'running' THEN running::float8
        WHEN 'dead' THEN dead::float8
        WHEN 'oldest_wait' THEN oldest_wait_seconds::float8
        WHEN 'served' THEN served::float8
        WHEN 'weight' THEN weight
    END * CASE WHEN %(descending)s THEN -1 ELSE 1 END NULLS LAST,
    name
LIMIT %(limit)s OFFSET %(offset)s

-- name: tenant_detail
SELECT t.name, t.id AS slot, t.weight, t.paused, t.concurrency_limit, t.running, t.rate_limit,
       t.rate_burst,
       rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) AS tokens,
       t.capacity, b.backlog, t.created_at
FROM rota.tenants t
LEFT JOIN rota.tenant_backlog b ON b.tenant = t.name
WHERE t.name = %(name)s

-- name: tenant_queues_stats
SELECT q.name AS queue, q.paused AS queue_paused, s.waiting, s.running, s.prefetched,
       s.scheduled, s.dead, extract(epoch FROM now() - s.oldest_enqueued_at) AS oldest_wait_seconds,
       (SELECT c.at FROM rota.stats_counted c) AS at
FROM rota.stats s JOIN rota.queues q ON q.id = s.queue_id
WHERE s.tenant_id = %(tenant_id)s
ORDER BY q.name

-- name: tenant_service
-- Completions per minute and their mean wait, over the last hour.
SELECT v.minute, sum(v.completed) AS completed,
       sum(v.wait_seconds) / nullif(sum(v.completed), 0) AS wait_seconds
FROM rota.service v
WHERE v.tenant_id = %(tenant_id)s AND v.minute >= now() - interval '1 hour'
GROUP BY v.minute ORDER BY v.minute

-- name: task_story
-- A task in PostgreSQL, whatever its state, with what decides its wait.
SELECT t.id, q.name AS queue, tn.name AS tenant, t.name, t.payload::text, t.status::text,
       t.attempts, t.max_attempts, t.cost, t.eta, t.enqueued_at, t.loaded_at, t.finished_at,
       t.last_error, t.traceback, t.cancel_requested,
       r.worker, r.attempt, r.claimed_at, r.lease_expires_at, r.started_at,
       r.running AS claim_running, s.run_at,
       q.paused AS queue_paused, tn.paused AS tenant_paused, tn.concurrency_limit,
       tn.running AS tenant_running, tn.rate_limit,
       rota.tokens_now(tn.rate_limit, tn.rate_burst, tn.tokens, tn.refilled_at) AS tokens,
       tn.capacity, t.priority, t.limit_key, k.running AS key_running,
       kl.concurrency_limit AS key_concurrency, kl.rate_limit AS key_rate,
       rota.tokens_now(kl.rate_limit, kl.rate_burst, k.tokens, k.refilled_at) AS key_tokens,
       p.task_id IS NOT NULL AS parked,
       t.seq, t.queue_id, t.tenant_id
FROM rota.tasks t
JOIN rota.queues q ON q.id = t.queue_id
JOIN rota.tenants tn ON tn.id = t.tenant_id
LEFT JOIN rota.claims r ON r.task_id = t.id
LEFT JOIN rota.scheduled s ON s.task_id = t.id
-- Its key of a limit, and whether it waits parked for the key's room.
LEFT JOIN rota.keys k ON k.name = t.limit_key
LEFT JOIN rota.key_limits kl ON kl.id = k.limit_id
LEFT JOIN rota.parked p ON p.task_id = t.id
WHERE t.id = %(id)s

-- name: finished_story
-- A succeeded task's record: attempts allowed and cost are NULL where the
-- record predates keeping them; its claim's time and run's seconds are NULL
-- where the record predates keeping them (started_at is then the claim's).
SELECT f.task_id AS id, q.name AS queue, tn.name AS tenant, f.attempts, f.max_attempts,
       f.cost, f.enqueued_at, f.started_at, f.finished_at, f.claimed_at, f.ran_seconds
FROM rota.finished f
JOIN rota.queues q ON q.id = f.queue_id
JOIN rota.tenants tn ON tn.id = f.tenant_id
WHERE f.task_id = %(id)s

-- name: place_in_line
-- A ready task's place: its row (found among its tenant's in its queue),
-- then the claimable rows ahead of it in fair order, counted up to a cap.
WITH mine AS (
    SELECT r.vtime, r.tenant_id, r.seq FROM rota.ready r
    WHERE r.queue_id = %(queue_id)s AND r.tenant_id = %(tenant_id)s AND r.seq = %(seq)s
)
SELECT m.vtime,
       (SELECT count(*) FROM (
            SELECT 1 FROM rota.ready a
            WHERE a.queue_id = %(queue_id)s
              AND (a.vtime, a.tenant_id, a.seq) < (m.vtime, m.tenant_id, m.seq)
            LIMIT %(cap)s) x) AS ahead
FROM mine m

-- name: urgent_turn
-- An urgent ready task (priority above 0), which runs at one of its tenant's
-- turns rather than at its own place (rota.claim): its tenant's tasks in its
-- queue that run before it (a higher priority, or its own and earlier: from
-- ready_urgent), its tenant's lower-priority tasks ahead of it in line that
-- it runs before, counted up to a cap, and the tenant's row whose turn it
-- takes (its seq): the tenant's (better + 1)-th in line.
WITH mine AS (
    SELECT r.vtime, r.seq, r.priority FROM rota.ready r
    WHERE r.queue_id = %(queue_id)s AND r.tenant_id = %(tenant_id)s AND r.seq = %(seq)s
), better AS (
    SELECT count(*) AS n FROM rota.ready r, mine m
    WHERE r.queue_id = %(queue_id)s AND r.tenant_id = %(tenant_id)s AND r.priority > 0
      AND (r.priority > m.priority
           OR (r.priority = m.priority AND (r.vtime, r.seq) < (m.vtime, m.seq)))
)
SELECT (SELECT n FROM better) AS better,
       (SELECT count(*) FROM (
            SELECT 1 FROM rota.ready r
            WHERE r.queue_id = %(queue_id)s AND r.tenant_id = %(tenant_id)s
              AND r.priority < m.priority AND (r.vtime, r.seq) < (m.vtime, m.seq)
            LIMIT %(cap)s) x) AS lower_ahead,
       (SELECT r.seq FROM rota.ready r
        WHERE r.queue_id = %(queue_id)s AND r.tenant_id = %(tenant_id)s
        ORDER BY r.vtime, r.seq OFFSET (SELECT n FROM better) LIMIT 1) AS turn_seq
FROM mine m

-- name: ready_rows
-- The planner's estimate of rota.ready's rows (as of the last ANALYZE).
SELECT greatest(reltuples, 0)::float8 FROM pg_class WHERE oid = 'rota.ready'::regclass

-- name: place_estimate
-- Past the exact count's cap: the rows ahead in a sample of the queue's
-- ready rows, scaled up. SYSTEM sampling reads whole pages, so it costs
-- the sampled share of the table, not a walk of everything ahead.
SELECT count(*) * 100.0 / %(percent)s
FROM rota.ready a TABLESAMPLE SYSTEM (%(percent)s)
WHERE a.queue_id = %(queue_id)s
  AND (a.vtime, a.tenant_id, a.seq) < (%(vtime)s, %(tenant_id)s, %(seq)s)

-- name: queue_workers
-- Live workers that claim a queue.
SELECT count(*) FROM rota.workers w
WHERE w.stopped_at IS NULL AND %(queue)s = ANY (w.queues)

-- name: task_audit
SELECT a.at, a.actor, a.action FROM rota.audit a
WHERE a.detail -> 'ids' ? %(id)s
ORDER BY a.at

-- name: ready_ids
-- Ready tasks in line order, per queue as the claim reads them, filtered.
SELECT c.task_id
FROM rota.queues q
CROSS JOIN LATERAL (
    SELECT r.task_id, r.vtime, r.tenant_id, r.seq FROM rota.ready r
    WHERE r.queue_id = q.id
      AND (%(tenant)s::text IS NULL
           OR r.tenant_id = (SELECT id FROM rota.tenants WHERE name = %(tenant)s))
    ORDER BY r.vtime, r.tenant_id, r.seq
    LIMIT %(limit)s
) c
WHERE %(queue)s::text IS NULL OR q.name = %(queue)s
ORDER BY c.vtime, c.tenant_id, c.seq
LIMIT %(limit)s

-- name: claim_ids
-- Claims that run (state `running`) or not started (`claimed`: prefetched),
-- as rota.claims tells them apart, by claim time.
SELECT r.task_id FROM rota.claims r
WHERE r.running = (%(state)s = 'running')
  AND (%(tenant)s::text IS NULL
       OR r.tenant_id = (SELECT id FROM rota.tenants WHERE name = %(tenant)s))
  AND (%(queue)s::text IS NULL
       OR r.queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s))
ORDER BY r.claimed_at
LIMIT %(limit)s

-- name: scheduled_ids
SELECT s.task_id FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id
WHERE (%(tenant)s::text IS NULL
       OR t.tenant_id = (SELECT id FROM rota.tenants WHERE name = %(tenant)s))
  AND (%(queue)s::text IS NULL
       OR t.queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s))
ORDER BY s.run_at
LIMIT %(limit)s

-- name: task_rows
-- The tasks with these ids, in the order given; a claimed task is running
-- or claimed (prefetched, rota.claims), its attempts the one it holds.
SELECT t.id, q.name AS queue, tn.name AS tenant, t.name,
       CASE WHEN r.task_id IS NULL THEN t.status::text
            WHEN r.running THEN 'running' ELSE 'claimed' END AS state,
       coalesce(r.attempt, t.attempts) AS attempts, t.max_attempts, t.enqueued_at,
       coalesce(s.run_at, t.finished_at) AS at,
       t.last_error, t.traceback
FROM unnest(%(ids)b::uuid[]) WITH ORDINALITY AS x(id, n)
JOIN rota.tasks t ON t.id = x.id
JOIN rota.queues q ON q.id = t.queue_id
JOIN rota.tenants tn ON tn.id = t.tenant_id
LEFT JOIN rota.claims r ON r.task_id = t.id
LEFT JOIN rota.scheduled s ON s.task_id = t.id
ORDER BY x.n

-- name: workers_view
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.started_at,
       extract(epoch FROM now() - w.heartbeat_at) AS silent_seconds,
       c.running, c.prefetched
FROM rota.workers w
-- Its claims, running or prefetched (rota.claims).
LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE r.running) AS running,
                          count(*) FILTER (WHERE NOT r.running) AS prefetched
                   FROM rota.claims r WHERE r.worker = w.id) c ON true
WHERE w.stopped_at IS NULL
ORDER BY w.started_at

-- name: recent_audit
SELECT a.at, a.actor, a.action, a.target, a.count, a.detail::text
FROM rota.audit a ORDER BY a.id DESC LIMIT %(limit)s

-- name: loader_batches
-- The Spark loaders' last micro-batch, per checkpoint (its partitions' sum).
SELECT DISTINCT ON (b.query) b.query AS checkpoint, b.batch_id, sum(b.tasks)::integer AS tasks,
       max(b.loaded_at) AS loaded_at
FROM rota.loader_batches b
GROUP BY b.query, b.batch_id
ORDER BY b.query, b.batch_id DESC

-- name: ping
SELECT 1

-- name: queue_pace
-- A queue's recent completions, as maintenance counts them into
-- rota.service: those of the last `minutes` whole minutes and of the
-- current one up to the count, the span they cover in seconds, and how long
-- ago the count ran. No row while completions were never counted.
SELECT coalesce((
           SELECT sum(s.completed) FROM rota.service s
           WHERE s.queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s)
             AND s.minute >= date_trunc('minute', c.up_to) - make_interval(mins => %(minutes)s)
       ), 0) AS completed,
       extract(epoch FROM c.up_to - (date_trunc('minute', c.up_to)
                                     - make_interval(mins => %(minutes)s))) AS seconds,
       extract(epoch FROM now() - c.up_to) AS counted_seconds_ago
FROM rota.service_counted c


-- name: top_tenants
-- The tenants with the most tasks waiting (the overview and the metrics):
-- rota.stats alone, not the tenants page's whole figures.
SELECT t.name, t.paused, s.waiting, s.running, s.dead, s.prefetched
FROM (
    SELECT tenant_id, sum(waiting) AS waiting, sum(running) AS running, sum(dead) AS dead,
           sum(prefetched) AS prefetched
    FROM rota.stats GROUP BY tenant_id
    ORDER BY sum(waiting) DESC, tenant_id LIMIT %(limit)s
) s
JOIN rota.tenants t ON t.id = s.tenant_id
ORDER BY s.waiting DESC, t.name

-- name: tenant_count
SELECT count(*) FROM rota.tenants

-- name: cancelled_ids
-- Cancelled tasks, the most recent first.
SELECT t.id FROM rota.tasks t
WHERE t.status = 'cancelled'
  AND (%(tenant)s::text IS NULL
       OR t.tenant_id = (SELECT id FROM rota.tenants WHERE name = %(tenant)s))
  AND (%(queue)s::text IS NULL
       OR t.queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s))
ORDER BY t.finished_at DESC
LIMIT %(limit)s

-- name: queue_history
-- The charts' history per queue (rota.queue_history, a day at most) since a
-- time, in buckets of `step` seconds: each gauge's largest count in the
-- bucket and its last, the completions and deaths summed, and the minutes'
-- fair levels are not read here (tenant_history applies them).
SELECT b.at, q.name AS queue, b.waiting, b.waiting_last, b.running, b.oldest_wait_seconds,
       b.oldest_wait_last, b.completed, b.died
FROM (
    SELECT to_timestamp(floor(extract(epoch FROM h.minute) / %(step)s) * %(step)s) AS at,
           h.queue_id,
           max(coalesce(h.waiting_max, h.waiting)) AS waiting,
           (array_agg(h.waiting ORDER BY h.minute DESC))[1] AS waiting_last,
           max(coalesce(h.running_max, h.running)) AS running,
           max(coalesce(h.oldest_wait_max, h.oldest_wait_seconds)) AS oldest_wait_seconds,
           (array_agg(h.oldest_wait_seconds ORDER BY h.minute DESC))[1] AS oldest_wait_last,
           sum(h.completed) AS completed, sum(h.died) AS died
    FROM rota.queue_history h
    WHERE h.minute >= %(since)s
    GROUP BY 1, 2
) b
JOIN rota.queues q ON q.id = b.queue_id
ORDER BY 1, 2

-- name: tenant_history
-- Some tenants' service since a time (rota.tenant_minutes), in buckets of
-- `step` seconds, per tenant summed over its queues: completions and their
-- mean wait; demand, the completions and the tasks unfinished at the
-- bucket's last minute (a backlog carried across the bucket's minutes is
-- asked for once); and the minutes' max-min fair shares summed, at most the
-- demand (NULL where no level was kept).
WITH m AS (
    SELECT to_timestamp(floor(extract(epoch FROM m.minute) / %(step)s) * %(step)s) AS at,
           m.minute, m.tenant_id, m.queue_id, m.completed, m.wait_seconds, m.demand,
           m.fair_share
    FROM rota.tenant_minutes(ARRAY(SELECT t.id FROM rota.tenants t
                                   WHERE t.name = ANY (%(names)b::text[])),
                             %(since)s, now()) m
), b AS (
    SELECT at, tenant_id, queue_id, sum(completed) AS completed,
           sum(wait_seconds) AS wait_seconds,
           sum(completed) + (array_agg(demand - completed ORDER BY minute DESC))[1] AS demand,
           sum(fair_share) AS fair_share
    FROM m GROUP BY 1, 2, 3
)
SELECT b.at, t.name AS tenant, sum(b.completed) AS completed,
       sum(b.wait_seconds) / nullif(sum(b.completed), 0) AS wait_seconds,
       sum(b.demand) AS demand,
       sum(CASE WHEN b.fair_share IS NOT NULL THEN least(b.demand, b.fair_share) END)
           AS fair_share
FROM b JOIN rota.tenants t ON t.id = b.tenant_id
GROUP BY 1, 2
ORDER BY 1, 2

-- name: top_served
-- The tenants most served since a time (rota.service by its minute, the
-- key's first column), for the service chart.
SELECT t.name
FROM (SELECT tenant_id, sum(completed) AS completed FROM rota.service
      WHERE minute >= %(since)s GROUP BY tenant_id
      HAVING sum(completed) > 0
      ORDER BY 2 DESC, 1 LIMIT %(limit)s) v
JOIN rota.tenants t ON t.id = v.tenant_id
ORDER BY v.completed DESC, t.name

-- name: fair_shares
-- Some tenants' service, demand and max-min fair share over the last
-- `minutes` whole minutes (the minute now is partial), per tenant summed
-- over its queues as tenant_history counts a bucket: the completions; the
-- demand, those and the tasks unfinished at the window's last minute; the
-- minutes' fair shares summed, at most the demand. `known`: some minute of
-- the window kept a fair level; `unfinished` and `last_completed`: the
-- tasks unfinished at the window's end, and the completions of its last
-- minute (how soon the tenant's own pace finishes them).
WITH m AS (
    SELECT m.minute, m.tenant_id, m.queue_id, m.completed, m.demand, m.fair_share
    FROM rota.tenant_minutes(ARRAY(SELECT t.id FROM rota.tenants t
                                   WHERE t.name = ANY (%(names)b::text[])),
                             date_trunc('minute', now()) - make_interval(mins => %(minutes)s),
                             date_trunc('minute', now())) m
), q AS (
    SELECT tenant_id, queue_id, sum(completed) AS served,
           (array_agg(demand - completed ORDER BY minute DESC))[1] AS unfinished,
           (array_agg(completed ORDER BY minute DESC))[1] AS last_completed,
           sum(fair_share) AS fair_share
    FROM m GROUP BY 1, 2
), r AS (
    SELECT tenant_id, served, unfinished, last_completed, served + unfinished AS demand,
           fair_share
    FROM q
)
SELECT t.name AS tenant, coalesce(sum(r.served), 0) AS served,
       coalesce(sum(r.demand), 0) AS demand,
       coalesce(sum(r.unfinished), 0) AS unfinished,
       coalesce(sum(r.last_completed), 0) AS last_completed,
       sum(CASE WHEN r.fair_share IS NOT NULL THEN least(r.demand, r.fair_share) END)
           AS fair_share,
       count(r.fair_share) > 0 AS known
FROM rota.tenants t
LEFT JOIN r ON r.tenant_id = t.id
WHERE t.name = ANY (%(names)b::text[])
GROUP BY t.name

-- name: task_result
SELECT status, value::text AS value, refused, kept, error, traceback, finished_at, expires_at
FROM rota.task_result(%(id)s::uuid)

-- name: task_progress
SELECT attempt, done, total, message, reported_at FROM rota.task_progress(%(id)s::uuid)

-- name: progress_of
-- The last progress of these tasks (those that reported one).
SELECT p.task_id, p.attempt, p.done, p.total, p.message, p.reported_at
FROM rota.progress p WHERE p.task_id = ANY (%(ids)b::uuid[])

-- name: listen_results
-- A task's id, when its result is kept or it ends without one.
LISTEN rota_results

-- name: task_graph
-- A task's place in a workflow: the join it belongs to (with its count), and
-- its own members when it is a join.
SELECT (SELECT m.join_id FROM rota.members m WHERE m.task_id = %(id)s) AS join_id,
       (SELECT j.waiting FROM rota.joins j JOIN rota.members m ON m.join_id = j.task_id
        WHERE m.task_id = %(id)s) AS join_waiting,
       (SELECT j.members FROM rota.joins j JOIN rota.members m ON m.join_id = j.task_id
        WHERE m.task_id = %(id)s) AS join_members,
       j.waiting, j.members, j.failed_member,
       ARRAY(SELECT m.task_id FROM rota.members m WHERE m.join_id = %(id)s
             ORDER BY m.position) AS member_ids
FROM (SELECT 1) one
LEFT JOIN rota.joins j ON j.task_id = %(id)s
