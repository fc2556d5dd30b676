-- Baselines for `rota bench`: the plain designs rota is measured against.

-- name: bench_fifo_schema
-- Each baseline queue lives in a schema of its own, so that several can be
-- measured side by side: {schema} is its name, formatted as an identifier
-- (so literal braces are doubled in these blocks).
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: bench_fifo_drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE

-- name: bench_fifo_setup
-- A narrow ready table in arrival order, the body in another table (the
-- measured "plain SKIP LOCKED" design; no fairness, no limits, no leases).
DROP TABLE IF EXISTS {schema}.rota_bench_fifo_ready, {schema}.rota_bench_fifo_body;
CREATE TABLE {schema}.rota_bench_fifo_body (id uuid PRIMARY KEY, payload json NOT NULL,
                                   status text NOT NULL DEFAULT 'queued');
CREATE TABLE {schema}.rota_bench_fifo_ready (seq bigserial PRIMARY KEY, id uuid NOT NULL);

-- name: bench_fifo_fill
WITH body AS (
    INSERT INTO {schema}.rota_bench_fifo_body (id, payload)
    SELECT gen_random_uuid(), '{{"args": [1, "payload-padding-abcdefghij"], "kwargs": {{}}}}'
    FROM generate_series(1, %(count)s)
    RETURNING id
)
INSERT INTO {schema}.rota_bench_fifo_ready (id) SELECT id FROM body

-- name: bench_fifo_claim
WITH taken AS (
    DELETE FROM {schema}.rota_bench_fifo_ready
    WHERE seq = ANY (ARRAY(SELECT seq FROM {schema}.rota_bench_fifo_ready ORDER BY seq
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING id
)
SELECT b.id, b.payload FROM {schema}.rota_bench_fifo_body b
WHERE b.id = ANY (ARRAY(SELECT id FROM taken))

-- name: bench_fifo_finish
UPDATE {schema}.rota_bench_fifo_body SET status = 'done' WHERE id = ANY (%(ids)b::uuid[])

-- name: bench_priority_fifo_setup
-- The plain FIFO with priorities, claimed as the peers order them (pgqueuer:
-- highest priority first, then in arrival order).
DROP TABLE IF EXISTS {schema}.rota_bench_fifo_ready, {schema}.rota_bench_fifo_body;
CREATE TABLE {schema}.rota_bench_fifo_body (id uuid PRIMARY KEY, payload json NOT NULL,
                                   status text NOT NULL DEFAULT 'queued');
CREATE TABLE {schema}.rota_bench_fifo_ready (seq bigserial PRIMARY KEY, id uuid NOT NULL,
                                    priority smallint NOT NULL);
CREATE INDEX rota_bench_fifo_order ON {schema}.rota_bench_fifo_ready (priority DESC, seq);

-- name: bench_priority_fifo_fill
-- One task at each of %(priorities)s, in that order.
WITH new AS MATERIALIZED (
    SELECT gen_random_uuid() AS id, p.priority, p.n
    FROM unnest(%(priorities)s::smallint[]) WITH ORDINALITY AS p (priority, n)
), body AS (
    INSERT INTO {schema}.rota_bench_fifo_body (id, payload)
    SELECT id, '{{"args": [1, "payload-padding-abcdefghij"], "kwargs": {{}}}}' FROM new
)
INSERT INTO {schema}.rota_bench_fifo_ready (id, priority) SELECT id, priority FROM new ORDER BY n

-- name: bench_priority_fifo_claim
WITH taken AS (
    DELETE FROM {schema}.rota_bench_fifo_ready
    WHERE seq = ANY (ARRAY(SELECT seq FROM {schema}.rota_bench_fifo_ready ORDER BY priority DESC, seq
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING id, priority
)
SELECT b.id, b.payload, t.priority FROM {schema}.rota_bench_fifo_body b JOIN taken t ON t.id = b.id
WHERE b.id = ANY (ARRAY(SELECT id FROM taken))

-- name: bench_leased_fifo_setup
-- The plain FIFO, but a claim records who runs the task until when in the
-- body's row and completion marks it done there (the peers' design: the
-- status in the job's row): the least a queue must write to give a crashed
-- worker's tasks back.
DROP TABLE IF EXISTS {schema}.rota_bench_fifo_ready, {schema}.rota_bench_fifo_body;
CREATE TABLE {schema}.rota_bench_fifo_body (id uuid PRIMARY KEY, payload json NOT NULL,
                                   status text NOT NULL DEFAULT 'queued',
                                   attempts integer NOT NULL DEFAULT 0, worker text,
                                   lease_expires_at timestamptz, finished_at timestamptz);
CREATE TABLE {schema}.rota_bench_fifo_ready (seq bigserial PRIMARY KEY, id uuid NOT NULL);

-- name: bench_leased_fifo_claim
WITH taken AS (
    DELETE FROM {schema}.rota_bench_fifo_ready
    WHERE seq = ANY (ARRAY(SELECT seq FROM {schema}.rota_bench_fifo_ready ORDER BY seq
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING id
)
UPDATE {schema}.rota_bench_fifo_body b
SET status = 'running', attempts = b.attempts + 1, worker = 'bench',
    lease_expires_at = now() + interval '30 seconds'
WHERE b.id = ANY (ARRAY(SELECT id FROM taken))
RETURNING b.id, b.payload

-- name: bench_leased_fifo_finish
UPDATE {schema}.rota_bench_fifo_body SET status = 'done', finished_at = now()
WHERE id = ANY (%(ids)b::uuid[]) AND status = 'running'

-- name: bench_rows_direct_claim
-- rota's own rows, written directly: the claim's row changes (out of
-- rota.ready in fair order, SKIP LOCKED; a lease in rota.running; the body
-- read from rota.tasks) in one plain statement, without rota.claim's limits,
-- priorities, keys, function calls or SECURITY DEFINER. What rota's tables
-- cost a claim, apart from its logic.
WITH c AS MATERIALIZED (
    SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id, r.priority
    FROM rota.ready r
    WHERE r.queue_id = (SELECT q.id FROM rota.queues q WHERE q.name = %(queue)s)
    ORDER BY r.vtime, r.tenant_id, r.seq
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM c))
), claimed AS MATERIALIZED (
    SELECT c.*, t.name, t.payload, t.attempts + 1 AS attempt
    FROM rota.tasks t JOIN c ON c.task_id = t.id
    WHERE t.id = ANY (ARRAY(SELECT task_id FROM c))
), leased AS (
    INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                              lease_expires_at, counted, priority)
    SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, 'bench',
           now() + interval '30 seconds', false, priority
    FROM claimed
)
SELECT task_id, payload FROM claimed ORDER BY vtime, tenant_id, seq

-- name: bench_rows_direct_finish
-- The completion's row changes, written directly: the lease and the body go,
-- a row in rota.finished stays.
WITH done AS (
    DELETE FROM rota.running WHERE task_id = ANY (%(ids)b::uuid[])
    RETURNING task_id, queue_id, tenant_id, attempt, claimed_at
), gone AS (
    DELETE FROM rota.tasks WHERE id = ANY (ARRAY(SELECT task_id FROM done))
    RETURNING id, enqueued_at, max_attempts, cost
)
INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                           max_attempts, cost)
SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at,
       g.max_attempts, g.cost
FROM done d JOIN gone g ON g.id = d.task_id

-- name: bench_fair_setup
-- The same workload for the fairness baselines: one row per task, in arrival order.
DROP TABLE IF EXISTS rota_bench_fair;
CREATE TABLE rota_bench_fair (seq bigserial PRIMARY KEY, tenant text NOT NULL);
CREATE INDEX rota_bench_fair_tenant ON rota_bench_fair (tenant, seq);

-- name: bench_fair_copy
COPY rota_bench_fair (tenant) FROM STDIN

-- name: bench_fifo_tenant_claim
-- Plain FIFO with SKIP LOCKED.
DELETE FROM rota_bench_fair
WHERE seq = ANY (ARRAY(SELECT seq FROM rota_bench_fair ORDER BY seq
                       LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
RETURNING tenant

-- name: bench_partition_claim
-- The claim-time window of the Hatchet post: rank each tenant's tasks, take
-- the lowest ranks first. It reads the whole backlog on every claim.
DELETE FROM rota_bench_fair
WHERE seq = ANY (ARRAY(
    SELECT seq FROM (
        SELECT seq, row_number() OVER (PARTITION BY tenant ORDER BY seq) AS turn
        FROM rota_bench_fair
    ) ranked
    ORDER BY turn, seq
    LIMIT %(limit)s))
RETURNING tenant

-- name: bench_fair_teardown
DROP TABLE IF EXISTS rota_bench_fair

-- name: bench_lock_sample
-- Per sample, of the claimers (client backends but this one): the most of
-- rota's relations one holds locks on, how many of those locks are off the
-- fast path, and how many claimers wait on the lock manager. (A starting
-- backend's catalog reads lock many relations, off the fast path by design.)
WITH claimers AS MATERIALIZED (
    SELECT pid, wait_event_type, wait_event FROM pg_stat_activity
    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
), held AS MATERIALIZED (
    SELECT l.pid, l.relation, l.fastpath FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.pid IN (SELECT pid FROM claimers)
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation IN (SELECT oid FROM pg_class WHERE relnamespace = 'rota'::regnamespace)
)
SELECT
    (SELECT max(n) FROM (SELECT count(DISTINCT relation) AS n FROM held GROUP BY pid) per_backend),
    (SELECT count(*) FROM held WHERE NOT fastpath),
    (SELECT count(*) FROM claimers WHERE wait_event_type = 'LWLock' AND wait_event = 'LockManager')

-- name: bench_reset
-- Empties rota's tables between benchmark runs.
TRUNCATE rota.tasks, rota.ready, rota.running, rota.scheduled, rota.finished,
         rota.tenant_queues, rota.tenants, rota.queues, rota.workers, rota.results,
         rota.joins, rota.members, rota.keys, rota.key_limits, rota.parked, rota.progress
         RESTART IDENTITY;
DROP TABLE IF EXISTS rota_bench_raw

-- name: bench_progress_writes
-- The progress the workers stored: rows written, tasks, flushes (a flush's
-- rows share its statement's now()).
SELECT coalesce(sum(writes), 0), count(*), count(DISTINCT reported_at) FROM rota.progress

-- name: bench_raw_setup
-- The raw COPY baseline's table: shaped like rota.tasks, primary key only.
DROP TABLE IF EXISTS rota_bench_raw;
CREATE UNLOGGED TABLE rota_bench_raw (LIKE rota.tasks INCLUDING DEFAULTS);
ALTER TABLE rota_bench_raw SET LOGGED, ADD PRIMARY KEY (id)

-- name: bench_raw_copy
COPY rota_bench_raw (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts,
                     backoff_base, backoff_max, status, eta, enqueued_at, tenant)
FROM STDIN (FORMAT BINARY)

-- name: bench_raw_copy_lean
-- bench_raw_copy of tasks that keep the defaults: the columns rota's load
-- COPYs for them (load.sql's copy_tasks_lean), the rest the defaults.
COPY rota_bench_raw (id, seq, queue_id, tenant_id, name, payload, enqueued_at, tenant)
FROM STDIN (FORMAT BINARY)

-- name: bench_indexed_setup
-- The least any fair design with a claim index writes: the raw table with
-- each task's place in line and a partial index in fair order (the issue's
-- alternative to a ready table), for one COPY and nothing else.
DROP TABLE IF EXISTS rota_bench_raw;
CREATE UNLOGGED TABLE rota_bench_raw (LIKE rota.tasks INCLUDING DEFAULTS);
ALTER TABLE rota_bench_raw SET LOGGED, ADD PRIMARY KEY (id),
    ADD COLUMN vtime double precision NOT NULL;
CREATE INDEX rota_bench_raw_fair_order ON rota_bench_raw (queue_id, vtime, tenant_id, seq)
    WHERE status = 'pending'

-- name: bench_indexed_copy
COPY rota_bench_raw (id, seq, queue_id, tenant_id, name, payload, cost, max_attempts,
                     backoff_base, backoff_max, status, eta, enqueued_at, tenant, vtime)
FROM STDIN (FORMAT BINARY)

-- name: bench_indexed_copy_lean
-- bench_indexed_copy of tasks that keep the defaults (bench_raw_copy_lean).
COPY rota_bench_raw (id, seq, queue_id, tenant_id, name, payload, enqueued_at, tenant, vtime)
FROM STDIN (FORMAT BINARY)

-- name: bench_analyze_ready
-- ANALYZE only: after churn, cleaning up is autovacuum's job, as in production.
ANALYZE rota.ready

-- name: bench_analyze_fifo
ANALYZE {schema}.rota_bench_fifo_ready, {schema}.rota_bench_fifo_body

-- name: bench_checkpoint
-- Before each fill: the fill pays the full-page writes of the pages it
-- touches, and the timed run after it, well under max_wal_size since, meets
-- no checkpoint of its own or one left by the run before.
CHECKPOINT

-- name: bench_analyze_fair
ANALYZE rota_bench_fair

-- name: bench_load_latencies
-- Enqueue -> claimable (loaded) of every task but the warm-up tenant's, in milliseconds.
SELECT extract(epoch FROM loaded_at - enqueued_at) * 1000 FROM rota.tasks
WHERE tenant IS DISTINCT FROM %(warm_up)s

-- name: bench_tracks_commit_timestamps
SHOW track_commit_timestamp

-- name: bench_commit_latencies
-- Enqueue -> committed (claimable from then on) of every task but the warm-up
-- tenant's, in milliseconds: the commit time of the transaction that wrote
-- the row (track_commit_timestamp).
SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin) - enqueued_at) * 1000 FROM rota.tasks
WHERE tenant IS DISTINCT FROM %(warm_up)s

-- name: bench_loader_batches
-- The tasks each micro-batch of a Spark loader query stored, in order.
SELECT sum(tasks)::integer FROM rota.loader_batches WHERE query = %(query)s
GROUP BY batch_id ORDER BY batch_id

-- name: bench_largest_tenant_share
-- The largest tenant's share of the tasks in rota.tasks.
SELECT coalesce(max(n)::float8 / nullif(sum(n), 0), 0)
FROM (SELECT count(*) AS n FROM rota.tasks GROUP BY tenant_id) c

-- name: bench_start_latencies
-- Enqueue -> start of every finished task, in milliseconds.
SELECT extract(epoch FROM f.started_at - f.enqueued_at) * 1000 FROM rota.finished f

-- name: bench_forget_finished
DELETE FROM rota.finished WHERE task_id = %(id)s

-- name: bench_live_workers
SELECT count(*) FROM rota.workers WHERE stopped_at IS NULL

-- name: bench_finished_count
SELECT count(*) FROM rota.finished

-- name: bench_finished_when_drained
-- rota.finished's count once no task waits or runs, NULL before: counting a
-- growing table many times a second would take a share of the server that
-- the benchmark measures.
SELECT CASE WHEN EXISTS (SELECT FROM rota.ready) OR EXISTS (SELECT FROM rota.running)
            THEN NULL ELSE (SELECT count(*) FROM rota.finished) END

-- name: bench_deepest_ready
-- The task last in line: the one whose place takes longest to count.
SELECT task_id FROM rota.ready ORDER BY vtime DESC LIMIT 1

-- name: bench_first_tenant
SELECT name FROM rota.tenants ORDER BY id LIMIT 1

-- name: bench_analyze
ANALYZE

-- name: bench_vacuum_queue
-- Between the arms of a side-by-side run: each arm starts from the same
-- table state, not from whatever autovacuum happens to be doing.
VACUUM (ANALYZE) rota.tasks, rota.ready, rota.running, rota.finished, rota.tenants,
    rota.tenant_queues

-- name: bench_backends_of
-- The server processes serving one application's connections.
SELECT pid FROM pg_stat_activity WHERE application_name = %(application)s

-- name: bench_finished_per_window
-- Completions per window of a run: window k starts at start + k * window
-- (epoch seconds).
SELECT floor((extract(epoch FROM finished_at) - %(start)s) / %(window)s)::int AS k, count(*)
FROM rota.finished
WHERE finished_at >= to_timestamp(%(start)s)
  AND finished_at < to_timestamp(%(start)s + %(window)s * %(windows)s)
GROUP BY 1

-- name: bench_compare_drop_database
-- `rota bench compare` gives every run a fresh database ({database} is
-- composed as an identifier).
DROP DATABASE IF EXISTS {database} WITH (FORCE)

-- name: bench_compare_create_database
CREATE DATABASE {database}

-- name: bench_compare_checkpoint
CHECKPOINT

-- name: bench_drop_plain_import
-- The plain JDBC write's table (`rota bench import`'s baseline).
DROP TABLE IF EXISTS bench_plain_import

-- name: bench_wal_lsn
-- Where the WAL is now: a later pg_wal_lsn_diff gives the bytes written since.
SELECT pg_current_wal_lsn()::text

-- name: bench_wal_since
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %(lsn)s::pg_lsn)::bigint

-- name: bench_shard_backlog
-- A shard's ready tasks in one queue (the sharding simulation's claim weight).
SELECT count(*) FROM rota.ready
WHERE queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s)

-- name: bench_shard_head
-- The start tag at the head of a shard's line (NULL: nothing waits): one
-- index probe of ready_fair_order.
SELECT vtime FROM rota.ready
WHERE queue_id = (SELECT id FROM rota.queues WHERE name = %(queue)s)
ORDER BY vtime LIMIT 1

-- name: bench_shard_floor
-- Lifts an idle shard's clock to the fleet's before a load (the simulated
-- shared clock): new tenants there start level with the busiest shards.
UPDATE rota.queues SET max_start = greatest(max_start, %(floor)s) WHERE name = %(queue)s

-- name: bench_shard_queue
INSERT INTO rota.queues (name) VALUES (%(queue)s) ON CONFLICT (name) DO NOTHING

-- name: bench_load_waits
-- What the parallel loads' backends wait on now (`rota bench load
-- --connections N`): one row per backend of that application name.
SELECT pid, coalesce(wait_event_type, '') AS wait_event_type, coalesce(wait_event, '') AS wait_event
FROM pg_stat_activity WHERE application_name = %(application)s

-- name: bench_statements_reset
-- pg_stat_statements from zero (it works only when the server preloads it).
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
SELECT pg_stat_statements_reset()

-- name: bench_statements_top
-- Where this database's time went since the reset, most first.
SELECT btrim(regexp_replace(regexp_replace(query, '--[^\n]*', '', 'g'), '\s+', ' ', 'g')),
       calls, total_exec_time
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%%pg_stat_statements%%' AND query NOT LIKE '%%pg_wal_lsn%%'
ORDER BY total_exec_time DESC
LIMIT %(limit)s

-- name: bench_listening
-- How many sessions of this database wait on rota's LISTEN (idle workers).
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle' AND query ~ 'LISTEN rota_(ready|cancel)'

-- name: bench_pgqueue_setup
-- The least a durable PostgreSQL queue written to directly does (the start
-- baseline of `rota bench end-to-end`): one table, a claim that leases,
-- completion that deletes.
DROP TABLE IF EXISTS {schema}.rota_bench_jobs;
CREATE TABLE {schema}.rota_bench_jobs (
    id bigserial PRIMARY KEY,
    payload json NOT NULL,
    enqueued_at double precision NOT NULL,  -- the producer's clock, as rota's envelope
    running boolean NOT NULL DEFAULT false,
    lease_until timestamptz
);
CREATE INDEX rota_bench_jobs_waiting ON {schema}.rota_bench_jobs (id) WHERE NOT running;

-- name: bench_pgqueue_enqueue
-- A tick's tasks and the wake-up in one statement: one round trip, one commit.
WITH added AS (
    INSERT INTO {schema}.rota_bench_jobs (payload, enqueued_at)
    SELECT p::json, %(enqueued_at)s FROM unnest(%(payloads)s::text[]) p
)
SELECT pg_notify('rota_bench_jobs', '')

-- name: bench_pgqueue_listen
LISTEN rota_bench_jobs

-- name: bench_pgqueue_claim
UPDATE {schema}.rota_bench_jobs SET running = true, lease_until = now() + interval '30 s'
WHERE id = ANY (ARRAY(SELECT id FROM {schema}.rota_bench_jobs WHERE NOT running ORDER BY id
                      LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
RETURNING id, payload, enqueued_at

-- name: bench_pgqueue_finish
DELETE FROM {schema}.rota_bench_jobs WHERE id = ANY (%(ids)s::bigint[])

-- name: bench_pgqueue_kept_setup
-- The flood's floor of a queue that keeps a record of each task it ran (as
-- rota.finished keeps one, for results, lookups and retention): the least
-- such a record costs, one narrow row and its primary key.
DROP TABLE IF EXISTS {schema}.rota_bench_jobs_done;
CREATE TABLE {schema}.rota_bench_jobs_done (
    id bigint PRIMARY KEY,
    enqueued_at double precision NOT NULL,
    finished_at timestamptz NOT NULL
);

-- name: bench_pgqueue_left
-- After a run: the tasks not completed.
SELECT count(*) FROM {schema}.rota_bench_jobs

-- name: bench_pgqueue_kept_count
-- After a run of the "kept" floor: the records kept.
SELECT count(*) FROM {schema}.rota_bench_jobs_done

-- name: bench_pgqueue_finish_kept
-- bench_pgqueue_finish, keeping each task's record.
WITH done AS (
    DELETE FROM {schema}.rota_bench_jobs WHERE id = ANY (%(ids)s::bigint[])
    RETURNING id, enqueued_at
)
INSERT INTO {schema}.rota_bench_jobs_done (id, enqueued_at, finished_at)
SELECT id, enqueued_at, now() FROM done

-- name: bench_copy_ceiling_setup
-- `rota bench import`'s one-connection ceiling: a table shaped as rota.tasks,
-- with its defaults and its indexes but not its trigger ({table}: an identifier).
DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (LIKE rota.tasks INCLUDING DEFAULTS INCLUDING INDEXES)

-- name: bench_copy_ceiling_copy
-- Binary, rows as copy_tasks_lean's (rota.core.load.TASK_COPY_TYPES_LEAN):
-- the file's tasks keep the defaults, so `rota import` COPYs these columns.
COPY {table} (id, seq, queue_id, tenant_id, name, payload, enqueued_at, tenant)
FROM STDIN (FORMAT BINARY)

-- name: bench_copy_ceiling_drop
DROP TABLE IF EXISTS {table}

-- name: bench_finished_at
-- When a task's completion began (its transaction's start).
SELECT finished_at FROM rota.finished WHERE task_id = %(id)s

-- name: bench_is_running
-- A task a worker has claimed.
SELECT 1 FROM rota.running WHERE task_id = %(id)s

-- name: bench_joins_done
-- Of the given joins: how many finished, how many ran more than once, and
-- each finished one's seconds from `since` to its end.
SELECT count(*) AS done,
       count(*) FILTER (WHERE f.attempts > 1) AS twice,
       coalesce(array_agg(extract(epoch FROM f.finished_at - %(since)s::timestamptz)), '{}')
           AS seconds
FROM rota.finished f WHERE f.task_id = ANY (%(ids)s::uuid[])

-- name: bench_waiting_of
-- Tasks in line per tenant (the runtime-fairness feeder keeps them topped up).
SELECT tn.name, count(*) FROM rota.ready r JOIN rota.tenants tn ON tn.id = r.tenant_id
GROUP BY tn.name

-- name: bench_runs_of
-- Runs per tenant that ended in the window.
SELECT tn.name, count(*)
FROM rota.finished f JOIN rota.tenants tn ON tn.id = f.tenant_id
WHERE f.finished_at >= %(since)s AND f.finished_at < %(until)s
GROUP BY tn.name

-- name: bench_finished_of
-- Tasks finished of the given tenants.
SELECT count(*) FROM rota.finished f JOIN rota.tenants t ON t.id = f.tenant_id
WHERE t.name = ANY (%(tenants)s)

-- name: bench_key_running
-- Tasks of a key running now.
SELECT count(*) FROM rota.running r JOIN rota.tasks t ON t.id = r.task_id
WHERE t.limit_key = %(key)s

-- name: bench_parked_count
SELECT count(*) FROM rota.parked

-- name: bench_accepted_attempts
-- The chaos suites' history check: the attempt whose completion each finished
-- task's end was recorded from.
SELECT task_id::text, attempts FROM rota.finished

-- name: bench_started_epochs
-- When each of these tasks started (seconds since the epoch).
SELECT task_id, extract(epoch FROM started_at) FROM rota.finished WHERE task_id = ANY (%(ids)s)

-- name: bench_fleet_insert
-- `rota bench fleet`'s floor: one request's task, one INSERT and its commit
-- (the table of bench_pgqueue_setup; no NOTIFY, its consumers poll).
INSERT INTO {schema}.rota_bench_jobs (payload, enqueued_at)
VALUES (%(payload)s, %(enqueued_at)s)
RETURNING id

-- name: bench_fleet_finished
-- `rota bench fleet`: each task rota's workers ran, its tenant, and its
-- enqueue -> start in milliseconds.
SELECT f.task_id::text, n.name, extract(epoch FROM f.started_at - f.enqueued_at) * 1000
FROM rota.finished f JOIN rota.tenants n ON n.id = f.tenant_id

-- name: bench_fleet_activity
-- `rota bench fleet`'s sampler: every other process of the server, with what
-- it waits on now (the sampler's own backend and the bench's are left out).
SELECT backend_type, state, coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND pid <> ALL (%(others)s::int[])

-- name: bench_fleet_max_connections
SELECT current_setting('max_connections')::int
