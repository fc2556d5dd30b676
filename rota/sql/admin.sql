-- Operators' actions.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: configure_tenant
SELECT rota.configure_tenant(%(name)s, %(weight)s, %(concurrency_limit)s, %(rate_limit)s,
                             %(rate_burst)s, %(capacity)s)

-- name: patch_tenant
SELECT rota.patch_tenant(%(name)s, %(changes)s::jsonb, %(actor)s)

-- name: cancel
SELECT id, outcome FROM rota.cancel(%(ids)b::uuid[], %(actor)s)

-- name: retry
SELECT id FROM rota.retry(%(ids)b::uuid[], %(actor)s, %(target)s) AS id

-- name: dead_ids
-- The dead tasks that match, most recently dead first.
SELECT t.id
FROM rota.tasks t
WHERE t.status = 'dead'
  AND (%(tenant)s::text IS NULL OR t.tenant_id = (SELECT id FROM rota.tenants WHERE name = %(tenant)s))
  AND (%(queue)s::text IS NULL OR t.queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s))
  AND (%(since)s::timestamptz IS NULL OR t.finished_at >= %(since)s)
ORDER BY t.finished_at DESC
LIMIT %(limit)s

-- name: pause_queue
SELECT rota.pause_queue(%(name)s, %(paused)s, %(actor)s)

-- name: pause_tenant
SELECT rota.pause_tenant(%(name)s, %(paused)s, %(actor)s)

-- name: record_action
INSERT INTO rota.audit (actor, action, target, detail, count)
VALUES (%(actor)s, %(action)s, %(target)s, %(detail)s::jsonb, %(count)s)

-- name: archive_span
-- The first and the last end, in [since, before), of a task that succeeded,
-- died or was cancelled: the span `rota archive` reads.
SELECT least(f.first, t.first) AS first, greatest(f.last, t.last) AS last
FROM (SELECT min(finished_at) AS first, max(finished_at) AS last FROM rota.finished
      WHERE finished_at >= %(since)s AND finished_at < %(before)s) f,
     (SELECT min(finished_at) AS first, max(finished_at) AS last FROM rota.tasks
      WHERE status IN ('dead', 'cancelled')
        AND finished_at >= %(since)s AND finished_at < %(before)s) t

-- name: archive_rows
-- What `rota archive` writes of the tasks that ended in [start, end): the
-- record of those that succeeded, with their result while it is kept, and
-- dead or cancelled ones whole.
SELECT f.task_id::text, 'succeeded', q.name, tn.name, NULL::text, NULL::text, f.attempts,
       f.enqueued_at, f.started_at, f.finished_at, NULL::text,
       CASE WHEN r.expires_at > now() THEN r.value::text END
FROM rota.finished f
JOIN rota.queues q ON q.id = f.queue_id
JOIN rota.tenants tn ON tn.id = f.tenant_id
LEFT JOIN rota.results r ON r.task_id = f.task_id
WHERE f.finished_at >= %(start)s AND f.finished_at < %(end)s
UNION ALL
SELECT t.id::text, t.status::text, q.name, tn.name, t.name, t.payload::text, t.attempts,
       t.enqueued_at, NULL, t.finished_at, t.last_error, NULL::text
FROM rota.tasks t
JOIN rota.queues q ON q.id = t.queue_id
JOIN rota.tenants tn ON tn.id = t.tenant_id
WHERE t.status IN ('dead', 'cancelled') AND t.finished_at >= %(start)s AND t.finished_at < %(end)s

-- name: record_archive
INSERT INTO rota.archives (before, since, location, tasks)
VALUES (%(before)s, %(since)s, %(location)s, %(tasks)s)

-- name: charge_queue
SELECT rota.charge_queue(%(name)s, %(charge_time)s, %(actor)s)

-- name: set_limit
-- An operator's limit on keys (kept over the app's declarations until reset).
SELECT rota.set_limit(%(name)s::text, %(concurrency)s::integer, %(rate)s::float8,
                      %(burst)s::float8, false, %(actor)s::text)

-- name: reset_limit
-- Hands a limit back to the app's declaration: the workers set it as
-- declared at their next start. Returns whether it exists.
UPDATE rota.key_limits SET declared = true, updated_at = now()
WHERE name = %(name)s
RETURNING name

-- name: drop_limit
SELECT rota.drop_limit(%(name)s::text, %(actor)s::text)

-- name: limits
-- Every limit on keys with its keys' counters (rota.limit_usage).
SELECT name, concurrency_limit AS concurrency, rate_limit AS rate, rate_burst AS burst, declared,
       keys, running, busiest_running, parked
FROM rota.limit_usage ORDER BY name
