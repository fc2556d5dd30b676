-- Producers and loaders: tasks into the tables, each at its fair place in line.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: load_prepare
-- One round trip before the rows go in: the queues' and tenants' ids (made on
-- first sight), the transaction's time (a task whose ETA is later waits
-- scheduled), one sequence number per task in arrival order, and the tasks
-- that already ran (a batch loaded again must not bring them back).
SELECT n.queue_ids, n.tenant_ids, now(),
       ARRAY(SELECT nextval('rota.task_seq') FROM generate_series(1, %(count)s) ORDER BY 1),
       ARRAY(SELECT task_id FROM rota.finished WHERE task_id = ANY (%(ids)b::uuid[]))
FROM rota.name_ids(%(queues)b::text[], %(tenants)b::text[]) n

-- name: load_savepoint
SAVEPOINT rota_load

-- name: load_rollback_to_savepoint
ROLLBACK TO SAVEPOINT rota_load

-- name: existing_tasks
SELECT id FROM rota.tasks WHERE id = ANY (%(ids)b::uuid[])

-- name: copy_tasks
-- Binary; rota.ops.TASK_COPY_TYPES names the column types.
COPY rota.tasks (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts, backoff_base,
                 backoff_max, status, eta, enqueued_at, tenant) FROM STDIN (FORMAT BINARY)

-- name: schedule_tasks
INSERT INTO rota.scheduled (run_at, task_id)
SELECT * FROM unnest(%(run_at)b::timestamptz[], %(ids)b::uuid[])

-- name: fair_starts
SELECT queue_id, tenant_id, weight, start
FROM rota.fair_starts(%(queue_ids)b::integer[], %(tenant_ids)b::integer[])

-- name: copy_ready
COPY rota.ready (queue_id, vtime, tenant_id, seq, task_id) FROM STDIN (FORMAT BINARY)

-- name: save_fair_tags
SELECT rota.save_fair_tags(%(queue_ids)b::integer[], %(tenant_ids)b::integer[],
                           %(finish_tags)b::float8[], %(clock_queue_ids)b::integer[],
                           %(max_starts)b::float8[])

-- name: insert_ready_save_fair_tags
-- A few tasks' places in line and their tenants' tags in one statement
-- (save_fair_tags's block, with the rows copy_ready would send).
WITH ready AS (
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id)
    SELECT * FROM unnest(%(ready_queue_ids)b::integer[], %(vtimes)b::float8[],
                         %(ready_tenant_ids)b::integer[], %(seqs)b::int8[],
                         %(task_ids)b::uuid[])
)
SELECT rota.save_fair_tags(%(queue_ids)b::integer[], %(tenant_ids)b::integer[],
                           %(finish_tags)b::float8[], %(clock_queue_ids)b::integer[],
                           %(max_starts)b::float8[])

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
