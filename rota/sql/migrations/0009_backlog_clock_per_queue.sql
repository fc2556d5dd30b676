-- The backlog estimate (rota.tenant_backlog, which every producer process
-- reads every ROTA_CAPACITY_CACHE_SECONDS for backpressure) computed a
-- queue's clock once per (queue, tenant) pair, and probed the (queue, tenant)
-- key by tenant alone. With one clock per queue the pairs are joined in one
-- pass.

CREATE OR REPLACE VIEW rota.tenant_backlog AS
SELECT t.name AS tenant, t.capacity,
       coalesce(sum(greatest(0, tq.finish_tag - c.clock) * t.weight), 0) AS backlog
FROM rota.tenants t
LEFT JOIN rota.tenant_queues tq ON tq.tenant_id = t.id
-- Each queue's clock once, not once per (queue, tenant) pair.
LEFT JOIN (SELECT q.id, rota.vclock(q.id) AS clock FROM rota.queues q) c ON c.id = tq.queue_id
GROUP BY t.id;
