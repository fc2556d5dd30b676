-- Named statements of rota's Python layer. Each block starts with `-- name: NAME`;
-- rota.sql.QUERIES maps names to text, and a test checks every name used exists.
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
-- Due scheduled tasks (ETA reached, retry backoff over), back to pending; they
-- get their fair place in line from rota.ops.make_ready.
WITH due AS (
    DELETE FROM rota.scheduled
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM rota.scheduled WHERE run_at <= now()
        ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING task_id
), promoted AS (
    UPDATE rota.tasks t SET status = 'pending'
    WHERE t.id = ANY (ARRAY(SELECT task_id FROM due)) AND t.status = 'scheduled'
    RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost
)
SELECT id, seq, queue_id, tenant_id, cost FROM promoted ORDER BY seq

-- name: claim
-- Claims up to `limit` ready tasks of the given queues in fair order, in one
-- statement. Tenants at their concurrency limit or out of rate tokens are
-- skipped by the scan; the admission below is the race-proof check. Tenants
-- without limits (most) skip the admission's locking, counting and ranking.
WITH limits AS MATERIALIZED (
    -- Every limited tenant (the partial index holds only those), and those
    -- that cannot take a task now.
    SELECT coalesce(array_agg(t.id), '{}') AS limited,
           coalesce(array_agg(t.id) FILTER (
               WHERE t.running >= t.concurrency_limit
                  OR t.rate_limit IS NOT NULL
                     AND least(t.rate_burst,
                               t.tokens + t.rate_limit * extract(epoch FROM now() - t.refilled_at)) < 1),
               '{}') AS blocked
    FROM rota.tenants t
    WHERE t.limited
), candidates AS MATERIALIZED (
    SELECT c.*, q.name AS queue
    FROM rota.queues q
    CROSS JOIN LATERAL (
        SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id
        FROM rota.ready r
        -- `+ 0` hides the column's statistics from this filter: when one
        -- tenant holds the whole backlog they make the planner expect no row
        -- to pass it, and it then sorts a seq scan of ready on every claim.
        WHERE r.queue_id = q.id AND r.tenant_id + 0 <> ALL ((SELECT blocked FROM limits)::integer[])
        ORDER BY r.vtime, r.tenant_id, r.seq
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE q.name = ANY (%(queues)b::text[])
    ORDER BY c.vtime, c.tenant_id, c.seq
    LIMIT %(limit)s
), limited AS MATERIALIZED (
    -- The candidates' limited tenants, locked in id order, as every writer of
    -- tenant counters locks them; FOR UPDATE reads the latest committed
    -- counters, so racing claims cannot both take the last free slot.
    SELECT t.id,
           t.concurrency_limit - t.running AS free_slots,
           -- least() skips NULLs: without a rate limit the tokens must stay NULL.
           CASE WHEN t.rate_limit IS NOT NULL
                THEN least(t.rate_burst,
                           t.tokens + t.rate_limit * extract(epoch FROM now() - t.refilled_at))
           END AS tokens
    FROM rota.tenants t
    WHERE t.limited AND t.id = ANY (ARRAY(
        SELECT DISTINCT c.tenant_id FROM candidates c
        WHERE c.tenant_id = ANY ((SELECT limited FROM limits)::integer[])))
    ORDER BY t.id
    FOR UPDATE
), admitted AS MATERIALIZED (
    -- Unlimited tenants' candidates as they are; a limited tenant's, in its
    -- order, as many as it has free slots and tokens.
    SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, false AS counted
    FROM candidates c
    WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
    UNION ALL
    SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id,
           l.free_slots IS NOT NULL
    FROM (
        SELECT candidates.*,
               row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
        FROM candidates
        WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
    ) c
    JOIN limited l ON l.id = c.tenant_id
    WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))
), charged AS (
    UPDATE rota.tenants t
    SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
        tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
        refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
    FROM (SELECT tenant_id, count(*) AS n FROM admitted GROUP BY tenant_id) a
    JOIN limited l ON l.id = a.tenant_id
    -- The ANY keeps the planner on the key, even with a plan made on few tenants.
    WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))
), taken AS (
    DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM admitted))
), claimed AS MATERIALIZED (
    SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.counted,
           t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
           now() + make_interval(secs => %(lease_seconds)s) AS lease_expires_at
    FROM rota.tasks t
    JOIN admitted a ON a.task_id = t.id
    WHERE t.id = ANY (ARRAY(SELECT task_id FROM admitted))
), leased AS (
    INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                              lease_expires_at, counted)
    SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, %(worker)s, lease_expires_at, counted
    FROM claimed
)
SELECT c.task_id AS id, c.name, c.payload::text, c.queue,
       -- Looked up only for tasks loaded before the name was copied (0011).
       coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
           AS tenant,
       c.attempt,
       c.max_attempts, c.lease_expires_at, c.enqueued_at
FROM claimed c
ORDER BY c.vtime, c.tenant_id, c.seq

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
UPDATE rota.running r
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM unnest(%(ids)b::uuid[], %(attempts)b::integer[]) AS x(id, attempt)
WHERE r.task_id = x.id AND r.attempt = x.attempt
RETURNING r.task_id

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
SELECT rota.prune_finished(make_interval(secs => %(seconds)s))

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
UPDATE rota.workers SET heartbeat_at = now() WHERE id = %(id)s AND stopped_at IS NULL
RETURNING id

-- name: stop_worker
UPDATE rota.workers SET stopped_at = now() WHERE id = %(id)s

-- name: live_workers
SELECT id, host, pid, extract(epoch FROM now() - heartbeat_at) AS silent_seconds
FROM rota.workers WHERE stopped_at IS NULL

-- name: reap_workers
-- Marks workers dead and returns their claimed tasks' ids, for requeueing.
WITH dead AS (
    UPDATE rota.workers SET stopped_at = now()
    WHERE id = ANY (%(ids)b::text[]) AND stopped_at IS NULL
    RETURNING id
)
SELECT r.task_id FROM rota.running r WHERE r.worker = ANY (ARRAY(SELECT id FROM dead))

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
