-- The demo's read-only statements (rota.demo).

-- name: demo_done_by_tenant
SELECT tn.name, count(*) FILTER (WHERE f.task_id IS NOT NULL)
FROM rota.tenants tn LEFT JOIN rota.finished f ON f.tenant_id = tn.id
GROUP BY tn.name

-- name: demo_done_of_tenant
SELECT count(*) FROM rota.finished f JOIN rota.tenants t ON t.id = f.tenant_id
WHERE t.name = %(tenant)s

-- name: demo_finished
-- Every finished task but the warm-up's, with its times in epoch seconds.
SELECT t.name AS tenant, extract(epoch FROM f.enqueued_at)::float8 AS enqueued,
       extract(epoch FROM f.started_at)::float8 AS started,
       extract(epoch FROM f.finished_at)::float8 AS finished
FROM rota.finished f JOIN rota.tenants t ON t.id = f.tenant_id
WHERE t.name <> %(warm_up)s
