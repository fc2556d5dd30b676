-- Views that call functions, made after them.

-- How much work (in cost units) each tenant has waiting, estimated from the
-- fair tags: a tenant's finish tag runs ahead of the clock by its backlog
-- divided by its weight. O(1) per tenant, for backpressure.
CREATE OR REPLACE VIEW rota.tenant_backlog AS
SELECT t.name AS tenant, t.capacity,
       coalesce(sum(greatest(0, tq.finish_tag - c.clock) * t.weight), 0) AS backlog
FROM rota.tenants t
LEFT JOIN rota.tenant_queues tq ON tq.tenant_id = t.id
-- Each queue's clock once, not once per (queue, tenant) pair.
LEFT JOIN (SELECT q.id, rota.vclock(q.id) AS clock FROM rota.queues q) c ON c.id = tq.queue_id
GROUP BY t.id;
