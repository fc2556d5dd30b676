-- Producers and loaders: tasks into the tables, each at its fair place in line.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: load_prepare
-- One round trip before the rows go in: the queues' and tenants' ids (made on
-- first sight), the transaction's time (a task whose ETA is later waits
-- scheduled), one sequence number per task in arrival order, and the tasks
-- that already ran (a batch loaded again must not bring them back).
SELECT n.queue_ids, n.tenant_ids, now() AS now,
       ARRAY(SELECT nextval('rota.task_seq') FROM generate_series(1, %(count)s) ORDER BY 1)
           AS seqs,
       ARRAY(SELECT task_id FROM rota.finished WHERE task_id = ANY (%(ids)b::uuid[]))
           AS already_ran
FROM rota.name_ids(%(queues)b::text[], %(tenants)b::text[]) n

-- name: load_savepoint
SAVEPOINT rota_load

-- name: load_rollback_to_savepoint
ROLLBACK TO SAVEPOINT rota_load

-- name: existing_tasks
-- The tasks of a batch stored meanwhile: in the table, or already run. A task
-- can finish after load_prepare looked (it was running then, in the table):
-- gone from the table by now, it must not be loaded again.
SELECT id FROM rota.tasks WHERE id = ANY (%(ids)b::uuid[])
UNION ALL
SELECT task_id FROM rota.finished WHERE task_id = ANY (%(ids)b::uuid[])

-- name: copy_tasks
-- Binary; rota.core.TASK_COPY_TYPES names the column types.
COPY rota.tasks (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts, backoff_base,
                 backoff_max, status, eta, enqueued_at, tenant) FROM STDIN (FORMAT BINARY)

-- name: copy_tasks_lean
-- copy_tasks for tasks that keep the defaults (cost 1, 3 attempts, backoff
-- from 1 s up to an hour) and have no ETA, most: the columns left out take
-- rota.tasks' defaults, which are those values (rota.core.load.LEAN_DEFAULTS;
-- tests/integration/test_load_columns.py). Types:
-- rota.core.TASK_COPY_TYPES_LEAN.
COPY rota.tasks (id, seq, queue_id, tenant_id, name, payload, enqueued_at, tenant)
FROM STDIN (FORMAT BINARY)

-- name: copy_tasks_options
-- copy_tasks with the tasks' priorities and limit keys
-- (rota.core.TASK_COPY_TYPES_OPTIONS).
COPY rota.tasks (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts, backoff_base,
                 backoff_max, status, eta, enqueued_at, tenant, priority, limit_key)
FROM STDIN (FORMAT BINARY)

-- name: copy_tasks_members
-- copy_tasks_options with the join each task is a member of (a workflow's
-- tasks: rota.core.TASK_COPY_TYPES_MEMBERS).
COPY rota.tasks (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts, backoff_base,
                 backoff_max, status, eta, enqueued_at, tenant, priority, limit_key, join_id)
FROM STDIN (FORMAT BINARY)

-- name: insert_tasks
-- A small load in one statement, which is its own transaction when nothing
-- else is open (one round trip in all): load_prepare's work, then the rows,
-- with the tasks that already ran left out and ids stored before ignored.
-- The insert trigger puts them in line as it does a COPY's rows. Larger loads
-- COPY (copy_tasks): cheaper per row. join_ids is NULL unless some task is a
-- workflow's member (unnest pads a NULL array with NULLs).
WITH n AS MATERIALIZED (
    SELECT n.queue_ids, n.tenant_ids,
           ARRAY(SELECT nextval('rota.task_seq') FROM generate_series(1, %(count)s) ORDER BY 1)
               AS seqs
    FROM rota.name_ids(%(queues)b::text[], %(tenants)b::text[]) n
), stored AS (
    INSERT INTO rota.tasks (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts,
                            backoff_base, backoff_max, status, eta, enqueued_at, tenant, priority,
                            limit_key, join_id)
    SELECT u.id, n.seqs[u.i], n.queue_ids[u.q], n.tenant_ids[u.t], u.name, u.payload::json,
           u.cost, u.max_attempts, u.backoff_base, u.backoff_max,
           (CASE WHEN u.eta > now() THEN 'scheduled' ELSE 'pending' END)::rota.task_status,
           u.eta, u.enqueued_at, (%(tenants)b::text[])[u.t], u.priority, u.limit_key, u.join_id
    FROM n, unnest(%(ids)b::uuid[], %(queue_of)b::int4[], %(tenant_of)b::int4[], %(names)b::text[],
                   %(payloads)b::text[], %(costs)b::float8[], %(max_attempts)b::int4[],
                   %(backoff_bases)b::float8[], %(backoff_maxes)b::float8[],
                   %(etas)b::timestamptz[], %(enqueued)b::timestamptz[], %(priorities)b::int2[],
                   %(limit_keys)b::text[], %(join_ids)b::uuid[])
            WITH ORDINALITY AS u(id, q, t, name, payload, cost, max_attempts, backoff_base,
                                 backoff_max, eta, enqueued_at, priority, limit_key, join_id, i)
    WHERE NOT EXISTS (SELECT FROM rota.finished f WHERE f.task_id = u.id)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM stored

-- name: tenant_backlog
-- The tenants with a capacity (backpressure) and their waiting work. The
-- filter reaches the view's scan, so tenants without a capacity cost nothing.
SELECT tenant, capacity, backlog FROM rota.tenant_backlog WHERE capacity IS NOT NULL

-- name: record_loader_batch
-- Returns a row only the first time a (query, batch, partition) is recorded.
INSERT INTO rota.loader_batches (query, batch_id, part, tasks)
VALUES (%(query)s, %(batch_id)s, %(part)s, 0)
ON CONFLICT (query, batch_id, part) DO NOTHING
RETURNING batch_id

-- name: count_loader_batch
-- The tasks the partition stored, once it is loaded (in the same transaction).
UPDATE rota.loader_batches SET tasks = %(tasks)s
WHERE query = %(query)s AND batch_id = %(batch_id)s AND part = %(part)s

-- name: add_workflow
-- A workflow's joins and members, after its tasks' load, in its transaction.
SELECT rota.add_workflow(%(joins)b::uuid[], %(results)s::text[], %(payloads)s::json[],
                         %(members)b::uuid[], %(member_joins)b::uuid[],
                         %(positions)s::integer[], %(tenant)s::text,
                         %(waiting_at)s::timestamptz)

-- name: commit_without_flush
-- A loader's commits make its tasks claimable at once, without waiting for
-- the WAL flush (a disk's slow fsync then delays no task's start); it
-- acknowledges nothing in the buffer before flush_commits returns.
SET synchronous_commit = off

-- name: flush_commits
-- Returns once every commit this connection made before it is as durable as
-- the server's own setting makes a commit: this transaction writes a record
-- (an empty logical message, prefix 'rota', which logical decoding may
-- show), so its commit waits for the WAL up to it, and so past all the
-- earlier commits, with the setting the connection began with.
SELECT set_config('synchronous_commit', reset_val, true),
       pg_logical_emit_message(true, 'rota', '')
FROM pg_settings WHERE name = 'synchronous_commit'
