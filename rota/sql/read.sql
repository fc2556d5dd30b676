-- The read model: what operators and scripts see.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: task_state
SELECT t.id, q.name AS queue, tn.name AS tenant,
       CASE WHEN r.task_id IS NOT NULL THEN 'running' ELSE t.status::text END AS status,
       t.attempts, t.last_error, t.finished_at
FROM rota.tasks t
JOIN rota.queues q ON q.id = t.queue_id
JOIN rota.tenants tn ON tn.id = t.tenant_id
LEFT JOIN rota.running r ON r.task_id = t.id
WHERE t.id = ANY (%(ids)b::uuid[])
UNION ALL
SELECT f.task_id, q.name, tn.name, 'succeeded', f.attempts, NULL, f.finished_at
FROM rota.finished f
JOIN rota.queues q ON q.id = f.queue_id
JOIN rota.tenants tn ON tn.id = f.tenant_id
WHERE f.task_id = ANY (%(ids)b::uuid[])

-- name: queue_counts
SELECT q.name AS queue,
       (SELECT count(*) FROM rota.ready r WHERE r.queue_id = q.id) AS ready,
       (SELECT count(*) FROM rota.running r WHERE r.queue_id = q.id) AS running,
       (SELECT count(*) FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id
        WHERE t.queue_id = q.id) AS scheduled
FROM rota.queues q
ORDER BY q.name
