-- Producers and loaders: tasks into the tables, each at its fair place in line.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: load_tasks
-- The whole load, one round trip: rota.load_tasks inserts the new tasks and
-- gives them their places in line. Returns how many were new.
SELECT rota.load_tasks(%(ids)b::uuid[], %(queues)b::text[], %(tenants)b::text[],
                       %(names)b::text[], %(payloads)b::text[], %(costs)b::float8[],
                       %(max_attempts)b::integer[], %(backoff_bases)b::float8[],
                       %(backoff_maxes)b::float8[], %(etas)b::timestamptz[],
                       %(enqueued_ats)b::timestamptz[])

-- name: tenant_backlog
-- The tenants with a capacity (backpressure) and their waiting work. The
-- filter reaches the view's scan, so tenants without a capacity cost nothing.
SELECT tenant, capacity, backlog FROM rota.tenant_backlog WHERE capacity IS NOT NULL

-- name: record_loader_batch
-- Returns a row only the first time a (query, batch) is recorded.
INSERT INTO rota.loader_batches (query, batch_id, tasks)
VALUES (%(query)s, %(batch_id)s, 0)
ON CONFLICT (query, batch_id) DO NOTHING
RETURNING batch_id

-- name: count_loader_batch
-- The tasks the batch stored, once it is loaded (in the same transaction).
UPDATE rota.loader_batches SET tasks = %(tasks)s
WHERE query = %(query)s AND batch_id = %(batch_id)s
