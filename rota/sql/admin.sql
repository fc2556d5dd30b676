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
