-- Named statements of rota's Python layer. Each block starts with `-- name: NAME`;
-- rota.sql.queries() maps names to text, and a test checks every name used exists.
-- Array parameters are sent in binary (`%(name)b`): psycopg's text form quotes
-- each element, which cost a worker about 0.3 ms per 100-task completion.

-- name: listen_ready
-- Loads, requeues and promotions notify this channel once per queue and batch.
LISTEN rota_ready

-- name: load_name_ids
SELECT queue_ids, tenant_ids FROM rota.name_ids(%(queues)b::text[], %(tenants)b::text[])

-- name: load_prepare
-- The transaction's time (a task whose ETA is later waits scheduled), one
-- sequence number per task in arrival order, and the tasks that already ran
-- (a batch loaded again must not bring them back).
SELECT now(),
       ARRAY(SELECT nextval('rota.task_seq') FROM generate_series(1, %(count)s) ORDER BY 1),
       ARRAY(SELECT task_id FROM rota.finished WHERE task_id = ANY (%(ids)b::uuid[]))

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

-- name: take_due
-- Due scheduled tasks, back to pending; they get their fair place in line
-- from rota.ops.make_ready.
SELECT id, seq, queue_id, tenant_id, cost FROM rota.take_due(%(limit)s::integer)

-- name: claim
-- Claims up to `limit` ready tasks of the given queues in fair order (SKIP
-- LOCKED), limits enforced; the statement is rota.claim's (schema.sql).
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at
FROM rota.claim(%(queues)b::text[], %(limit)s::integer, %(worker)s::text,
                %(lease_seconds)s::float8)

-- name: complete
SELECT id FROM rota.complete(%(ids)b::uuid[], %(attempts)b::integer[]) AS id

-- name: fail
SELECT id, status::text, run_at
FROM rota.fail(%(ids)b::uuid[], %(attempts)b::integer[], %(errors)b::text[],
               %(retry_at)b::timestamptz[], %(final)b::boolean[])

-- name: defer_unknown
SELECT id, status::text
FROM rota.defer_unknown(%(ids)b::uuid[], %(attempts)b::integer[], %(delay)s, %(grace)s,
                        %(reason)s)

-- name: worker_claims
-- The tasks a worker holds (to find what a claim it could not read took).
SELECT task_id, attempt FROM rota.running WHERE worker = %(worker)s

-- name: requeue
SELECT id FROM rota.requeue(%(ids)b::uuid[], %(attempts)b::integer[], %(consume)s,
                            %(reason)s) AS id

-- name: requeue_expired
SELECT id FROM rota.requeue_expired() AS id

-- name: extend_leases
-- Heartbeat: returns the ids whose lease this worker still holds.
SELECT id FROM rota.extend_leases(%(ids)b::uuid[], %(attempts)b::integer[],
                                  %(lease_seconds)s::float8) AS id

-- name: configure_tenant
SELECT rota.configure_tenant(%(name)s, %(weight)s, %(concurrency_limit)s, %(rate_limit)s,
                             %(rate_burst)s, %(capacity)s)

-- name: tenant_backlog
-- The tenants with a capacity (backpressure) and their waiting work. The
-- filter reaches the view's scan, so the others cost nothing: with 1,000
-- tenants, two of them with a capacity, 0.65 ms against 24 ms for all.
SELECT tenant, capacity, backlog FROM rota.tenant_backlog WHERE capacity IS NOT NULL

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

-- name: prune_finished
SELECT rota.prune_finished(make_interval(secs => %(seconds)s), %(limit)s::integer)

-- name: prune_dead
SELECT rota.prune_dead(make_interval(secs => %(seconds)s), %(limit)s::integer)

-- name: prune_workers
SELECT rota.prune_workers(make_interval(secs => %(seconds)s))

-- name: prune_loader_batches
SELECT rota.prune_loader_batches(make_interval(secs => %(seconds)s), %(keep)s::integer)

-- name: stopped_workers_claims
SELECT task_id FROM rota.stopped_workers_claims(make_interval(secs => %(seconds)s)) AS task_id

-- name: queue_counts
SELECT q.name AS queue,
       (SELECT count(*) FROM rota.ready r WHERE r.queue_id = q.id) AS ready,
       (SELECT count(*) FROM rota.running r WHERE r.queue_id = q.id) AS running,
       (SELECT count(*) FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id
        WHERE t.queue_id = q.id) AS scheduled
FROM rota.queues q
ORDER BY q.name

-- name: applied_migrations
SELECT version FROM rota.migrations ORDER BY version

-- name: migrations_table_exists
SELECT to_regclass('rota.migrations') IS NOT NULL

-- name: record_migration
INSERT INTO rota.migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_lock
-- Concurrent `rota migrate` runs take turns.
SELECT pg_advisory_xact_lock(hashtext('rota.migrate'))

-- name: register_worker
INSERT INTO rota.workers (id, host, pid, queues, concurrency)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s)

-- name: worker_heartbeat
SELECT rota.worker_heartbeat(%(id)s::text)

-- name: stop_worker
SELECT rota.stop_worker(%(id)s::text)

-- name: live_workers
SELECT id, host, pid, extract(epoch FROM now() - heartbeat_at) AS silent_seconds
FROM rota.workers WHERE stopped_at IS NULL

-- name: reap_workers
-- Marks workers dead and returns their claimed tasks' ids, for requeueing.
SELECT task_id FROM rota.reap_workers(%(ids)b::text[]) AS task_id

-- name: queue_names
SELECT name FROM rota.queues ORDER BY name

-- name: maintenance_lock
-- One elected runner of the maintenance duties (session lock, held while alive).
SELECT pg_try_advisory_lock(hashtext('rota.maintenance'))

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
