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

-- Which claims run (the one definition of "running": rota.stats, the
-- console, the CLI, the HTTP API and the metrics read it): a worker runs at
-- most its concurrency of its claims at once, those its heartbeat told
-- started first, then in claim order (as its pool starts them); the rest
-- are claimed, not started (prefetched). The claims of a worker with no
-- row (a script's or a test's claims) run: nothing says how many it runs at
-- once. tenants.running, a limit's counter, counts every claim.
CREATE OR REPLACE VIEW rota.claims AS
SELECT r.task_id, r.queue_id, r.tenant_id, r.vtime, r.seq, r.attempt, r.worker, r.claimed_at,
       r.lease_expires_at, r.counted, r.priority, r.key_id, r.started_at,
       w.concurrency IS NULL
       OR row_number() OVER (PARTITION BY r.worker
                             ORDER BY r.started_at IS NULL, r.claimed_at, r.vtime, r.seq)
          <= w.concurrency AS running
FROM rota.running r
LEFT JOIN rota.workers w ON w.id = r.worker;
