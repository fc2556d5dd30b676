-- rota: the current schema's tables, types and indexes, for fresh databases
-- (`rota migrate`). Every change here also gets a migration in migrations/; a
-- test checks that both agree. The functions, and the triggers and views that
-- call them, live in functions/, which `rota migrate` applies after this or
-- after the migrations (rota/core/migrate.py).
--
-- Where tasks live:
--   tasks      the body of every task, loaded once (the id is minted by the producer);
--   ready      a narrow table of claimable tasks in fair order; rows leave on claim;
--   running    claimed tasks with their lease and attempt token (fencing);
--   scheduled  tasks waiting for an ETA or a retry backoff; they get their fair
--              position when they fall due.
-- Fairness is decided at insert time (start-time fair queueing, docs/architecture.md):
-- a claim is a plain index scan of ready in (vtime, tenant slot, arrival) order.

CREATE SCHEMA IF NOT EXISTS rota;

CREATE TABLE rota.migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The files of functions/ as last applied, by their text's checksum: a file
-- is applied again when its text changes.
CREATE TABLE rota.repeatables (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The schema version this database is at (rota/sql/schema_versions.txt), and
-- the oldest one whose processes still run on it: one row, written by
-- `rota migrate`; processes read it when they connect (rota.core.versions).
CREATE TABLE rota.schema_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version integer NOT NULL,
    supports_from integer NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rota.queues (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CONSTRAINT queue_name_rule CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    -- The virtual clock's floor when nothing waits (rota.vclock): loads
    -- record their largest start per tenant (rota.tenant_queues.last_start)
    -- and never write this row, so that they need not lock it.
    max_start double precision NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Paused: its tasks wait, loaded and in line, until it is resumed.
    paused boolean NOT NULL DEFAULT false,
    -- Charged by time: a tenant's task costs its measured seconds per run
    -- (rota.tenant_queues.run_seconds; this queue's, for a tenant not yet
    -- measured), times its declared cost; else its declared cost alone.
    charge_time boolean NOT NULL DEFAULT false,
    run_seconds double precision,
    -- Holds tasks whose key's limit exists: only these queues' claims check
    -- limits on keys (rota.key_admit).
    key_limited boolean NOT NULL DEFAULT false
);

CREATE TABLE rota.tenants (
    -- The id is the tenant's slot: it breaks ties between tenants within a round.
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE
        CONSTRAINT tenant_name_rule CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$'),
    -- Bounded (as is cost): fair tags are sums of cost / weight in double precision.
    weight double precision NOT NULL DEFAULT 1
        CONSTRAINT weight_bounded CHECK (weight >= 1e-6 AND weight <= 1e6),
    concurrency_limit integer CONSTRAINT concurrency_limit_not_negative CHECK (concurrency_limit >= 0),
    rate_limit double precision CONSTRAINT rate_limit_positive CHECK (rate_limit > 0),
    rate_burst double precision NOT NULL DEFAULT 1 CONSTRAINT rate_burst_at_least_one CHECK (rate_burst >= 1),
    capacity bigint CONSTRAINT capacity_not_negative CHECK (capacity >= 0),
    -- Claimed-and-unfinished tasks, kept only while a concurrency limit is set.
    running integer NOT NULL DEFAULT 0,
    -- Token bucket of the rate limit.
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Paused: its tasks wait, in line, until it is resumed (the claim skips it).
    paused boolean NOT NULL DEFAULT false,
    -- The claim checks these tenants' limits; the others it takes as they come.
    limited boolean GENERATED ALWAYS AS
        (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL OR paused) STORED
);
CREATE INDEX tenants_limited ON rota.tenants (id) WHERE limited;

-- Each tenant's virtual finish tag, per queue. A load locks the rows of its
-- pairs (rota.advance_tags): loads of one tenant take turns, loads of others
-- do not wait for them.
CREATE TABLE rota.tenant_queues (
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    finish_tag double precision NOT NULL,
    PRIMARY KEY (queue_id, tenant_id),
    -- The largest start tag given to the pair's tasks: the queue's virtual
    -- clock, when nothing waits, is the largest of them (rota.vclock).
    last_start double precision NOT NULL DEFAULT 0,
    -- In a queue charged by time: the pair's measured seconds per run (a
    -- moving mean, rota.record_run_times), which each of its tasks costs.
    run_seconds double precision
);
CREATE INDEX tenant_queues_last_start ON rota.tenant_queues (queue_id, last_start);

-- Succeeded tasks are not here but in rota.finished; 'cancelled' is an
-- operator's doing (rota.cancel).
CREATE TYPE rota.task_status AS ENUM ('pending', 'scheduled', 'dead', 'cancelled');

CREATE SEQUENCE rota.task_seq AS bigint CACHE 1000;

-- No foreign keys on the hot tables: the queue functions keep them consistent,
-- and a per-row FK check would cost bulk loading and claiming.
CREATE TABLE rota.tasks (
    id uuid PRIMARY KEY,
    seq bigint NOT NULL DEFAULT nextval('rota.task_seq'),
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    name text NOT NULL,
    payload json NOT NULL,  -- validated text, handed back as written (0006)
    cost double precision NOT NULL DEFAULT 1
        CONSTRAINT cost_bounded CHECK (cost > 0 AND cost <= 1e6),
    max_attempts integer NOT NULL DEFAULT 3 CONSTRAINT max_attempts_positive CHECK (max_attempts >= 1),
    backoff_base double precision NOT NULL DEFAULT 1,
    backoff_max double precision NOT NULL DEFAULT 3600,
    -- pending: in ready or running (the running table tells which).
    status rota.task_status NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    eta timestamptz,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    loaded_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    last_error text,
    -- The tenant's name, copied at load time so that a claim need not look it
    -- up (NULL for tasks loaded before it was copied).
    tenant text,
    -- When a worker that did not know the task's name first handed it back.
    unknown_since timestamptz,
    -- The last failure's whole traceback (last_error is its one line).
    traceback text,
    -- Cancelled while running: the attempt ends as 'cancelled', not retried.
    cancel_requested boolean NOT NULL DEFAULT false,
    -- Within its tenant: 0 (normal) to 9, higher first (0024).
    priority smallint NOT NULL DEFAULT 0
) WITH (
    fillfactor = 90,
    -- Truncating its emptied pages (it empties whenever the fleet catches up)
    -- takes an ACCESS EXCLUSIVE lock, which stalls every load and claim.
    vacuum_truncate = false,
    -- Analyzed after 100k changed rows at the least: small and churning, it
    -- was otherwise analyzed on every autovacuum round, in bursts that
    -- stalled the claims (0033). Its readers go by key or by index.
    autovacuum_analyze_threshold = 100000
);

-- The bounds of rota/model/rules.py, the last line after every entrance's checks
-- (a test compares them). NOT VALID, as a migration added them: rows stored
-- before are not rechecked; every new or changed row is.
ALTER TABLE rota.tasks
    ADD CONSTRAINT task_name_rule
        CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*$'
               AND length(name) <= 200) NOT VALID,
    ADD CONSTRAINT max_attempts_bounded CHECK (max_attempts <= 10000) NOT VALID,
    ADD CONSTRAINT backoff_bounded
        CHECK (backoff_base >= 0 AND backoff_base <= 315360000
               AND backoff_max >= 0 AND backoff_max <= 315360000) NOT VALID,
    ADD CONSTRAINT eta_bounded
        CHECK (eta >= '2000-01-01 00:00:00+00' AND eta < '2200-01-01 00:00:00+00') NOT VALID,
    ADD CONSTRAINT enqueued_at_bounded
        CHECK (enqueued_at >= '2000-01-01 00:00:00+00'
               AND enqueued_at < '2200-01-01 00:00:00+00') NOT VALID,
    ADD CONSTRAINT priority_bounded CHECK (priority >= 0 AND priority <= 9) NOT VALID;
-- A task's key of a limit (rota.key_limits, rota.keys): `name` or `name/value`.
ALTER TABLE rota.tasks ADD COLUMN limit_key text,
    ADD CONSTRAINT limit_key_rule
        CHECK (limit_key ~ '^[a-z][a-z0-9_.-]{0,62}(/[^[:cntrl:]]{1,200})?$') NOT VALID;
ALTER TABLE rota.tenants
    ADD CONSTRAINT concurrency_limit_bounded CHECK (concurrency_limit <= 1000000) NOT VALID,
    ADD CONSTRAINT rate_limit_bounded CHECK (rate_limit <= 1e6) NOT VALID,
    ADD CONSTRAINT rate_burst_bounded CHECK (rate_burst <= 1e9) NOT VALID,
    ADD CONSTRAINT capacity_bounded CHECK (capacity <= 1000000000000) NOT VALID;

CREATE TABLE rota.ready (
    queue_id integer NOT NULL,
    vtime double precision NOT NULL,
    tenant_id integer NOT NULL,
    seq bigint NOT NULL,
    task_id uuid NOT NULL,
    priority smallint NOT NULL DEFAULT 0
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 100000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    -- Truncating empty pages takes an ACCESS EXCLUSIVE lock, which pushes
    -- every claim's locks off the lock manager's fast path.
    vacuum_truncate = false
);
CREATE INDEX ready_fair_order ON rota.ready (queue_id, vtime, tenant_id, seq);
-- A tenant's urgent tasks, best first, for the claim's swap (rota.claim):
-- partial, so tasks at priority 0 (most) cost the load and the claim nothing.
CREATE INDEX ready_urgent ON rota.ready (queue_id, tenant_id, priority DESC, vtime, seq)
    WHERE priority > 0;

-- Small (in-flight tasks only): no index beyond the key is worth its upkeep.
CREATE TABLE rota.running (
    task_id uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    vtime double precision NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL,
    worker text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz NOT NULL,
    -- Whether the tenant's running counter includes this task.
    counted boolean NOT NULL,
    priority smallint NOT NULL DEFAULT 0,
    -- The key (rota.keys) whose running counter includes this task, if any.
    key_id integer,
    -- When its run began, as its worker's heartbeat told (NULL: not known to
    -- have started; prefetched, or not yet told). rota.claims says which
    -- claims run.
    started_at timestamptz
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);

-- Limits on keys other than the tenant (docs/howto/limits.md): a task names a
-- key of a limit (tasks.limit_key: `stripe`, or `reports/acme:render` for a
-- limit per value); the limit's concurrency and rate hold for each key, over
-- every tenant. Declared by the app's workers (rota.declare_limits) or set
-- by an operator (rota.set_limit).
CREATE TABLE rota.key_limits (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CONSTRAINT limit_name_rule CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    concurrency_limit integer
        CONSTRAINT limit_concurrency_bounded CHECK (concurrency_limit BETWEEN 0 AND 1000000),
    rate_limit double precision CONSTRAINT limit_rate_bounded CHECK (rate_limit > 0 AND rate_limit <= 1e6),
    rate_burst double precision NOT NULL DEFAULT 1
        CONSTRAINT limit_burst_bounded CHECK (rate_burst >= 1 AND rate_burst <= 1e9),
    -- Set in code (the workers' declaration keeps it as declared), or by an
    -- operator (kept until changed).
    declared boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per key that some loaded task names while its limit exists: the
-- key's counters. Made by the load (rota.tasks_enter_line) and by
-- rota.set_limit for the tasks already loaded.
CREATE TABLE rota.keys (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    limit_id integer NOT NULL,
    -- Claimed-and-unfinished tasks, kept while the limit has a concurrency.
    running integer NOT NULL DEFAULT 0,
    -- Token bucket of the limit's rate.
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    -- Tasks set aside (rota.parked), at least: a claim that parks counts
    -- them; rota.unpark takes them back when the key has room.
    parked integer NOT NULL DEFAULT 0
);
CREATE INDEX keys_of_limit ON rota.keys (limit_id);
CREATE INDEX keys_parked ON rota.keys (id) WHERE parked > 0;

-- Tasks whose key had no room when a claim met them: out of line, so that
-- claims do not step over them again and again, and back in line at their
-- own places (rota.unpark) once their key has room.
CREATE TABLE rota.parked (
    key_id integer NOT NULL,
    queue_id integer NOT NULL,
    vtime double precision NOT NULL,
    tenant_id integer NOT NULL,
    seq bigint NOT NULL,
    task_id uuid NOT NULL PRIMARY KEY,
    priority smallint NOT NULL DEFAULT 0
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
CREATE INDEX parked_order ON rota.parked (key_id, vtime, tenant_id, seq);

-- Append-only log of succeeded tasks, narrow. Its key also keeps a batch
-- that is loaded again (a loader died before acknowledging it) from bringing
-- back tasks that already ran; UUIDv7 ids make its inserts append at the right
-- edge of the index.
CREATE TABLE rota.finished (
    task_id uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    attempts integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    -- When its last run began, as its worker measured it; its claim's time
    -- where the worker did not say (claimed_at NULL: finished before runs'
    -- starts were kept, when this was always the claim's time).
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    -- The task's attempts allowed and cost (NULL: finished before they were kept).
    max_attempts integer,
    cost double precision,
    -- When its last attempt was claimed, and the seconds it ran, measured by
    -- its worker (NULL: not told, or finished before they were kept).
    claimed_at timestamptz,
    ran_seconds double precision
) WITH (
    -- As rota.tasks: analyzed after 100k new rows at the least (0033).
    autovacuum_analyze_threshold = 100000
);
CREATE INDEX finished_at ON rota.finished USING brin (finished_at);

-- Each `rota archive --before B` run: everything that ended before B and at
-- or after the previous run's B, written once to `location`. Retention, when
-- told to wait for the archive, keeps what ended at or after the last B.
CREATE TABLE rota.archives (
    before timestamptz PRIMARY KEY,
    since timestamptz,
    location text NOT NULL,
    tasks bigint NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);

-- The Spark loader's ledger of loaded micro-batch partitions (exactly once):
-- each executor loads each group of its partition's tenants in a transaction
-- with its row.
CREATE TABLE rota.loader_batches (
    query text NOT NULL,  -- the streaming query's checkpoint: batch ids restart with it
    batch_id bigint NOT NULL,
    tasks integer NOT NULL,
    loaded_at timestamptz NOT NULL DEFAULT now(),
    part integer NOT NULL DEFAULT 0,  -- shard * groups + group (rota.loader.spark_load)
    PRIMARY KEY (query, batch_id, part)
);

-- The worker registry (heartbeats, for the reaper).
CREATE TABLE rota.workers (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    concurrency integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at timestamptz,
    secret_hash bytea,  -- sha256 of the secret the worker registered with
    heartbeat_seconds double precision,  -- how often it beats
    -- Declared dead for its silence (it may only be cut off): what it holds
    -- goes back in line as its leases pass.
    declared_dead boolean NOT NULL DEFAULT false
);
CREATE INDEX workers_alive ON rota.workers (heartbeat_at) WHERE stopped_at IS NULL;

CREATE TABLE rota.scheduled (
    run_at timestamptz NOT NULL,
    task_id uuid NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
CREATE INDEX scheduled_run_at ON rota.scheduled (run_at);

-- Workflows (rota.workflow): a join is a task that waits, holding no place
-- in line, no slot and no concurrency count, until each of its members has
-- succeeded. A member's completion counts its join down in the completion's
-- own transaction (rota.complete_counted), so a join enters the line exactly
-- once. While it waits a join is 'scheduled' with no row in rota.scheduled;
-- the last member's completion gives it one, due now, and maintenance puts it
-- in line with its members' results as its first argument.
CREATE TABLE rota.joins (
    task_id uuid PRIMARY KEY,
    members integer NOT NULL CONSTRAINT members_positive CHECK (members > 0),
    waiting integer NOT NULL CONSTRAINT waiting_bounded CHECK (waiting BETWEEN 0 AND members),
    -- 'one': the first argument is the one member's result (a chain's step);
    -- 'list': the list of the members' results, in their order (a group's join).
    results text NOT NULL CONSTRAINT results_kind CHECK (results IN ('one', 'list')),
    -- The join's own payload, which its members' results are put before.
    payload json NOT NULL,
    -- The member whose death or cancel made the join dead (retrying it lets
    -- the join wait again).
    failed_member uuid,
    -- Its count reached zero: it was made due (once).
    released boolean NOT NULL DEFAULT false
) WITH (
    -- Room on the page: a countdown changes no indexed column, so that each
    -- member's completion rewrites the row in place (HOT).
    fillfactor = 50
);
-- Whether any join waits: completions look for members only then.
CREATE INDEX joins_waiting ON rota.joins (task_id) WHERE NOT released;

CREATE TABLE rota.members (
    task_id uuid PRIMARY KEY,  -- a task has one join at most: a graph is a tree
    join_id uuid NOT NULL REFERENCES rota.joins (task_id) ON DELETE CASCADE,
    position integer NOT NULL  -- its result's place among the join's members
);
CREATE INDEX members_of_join ON rota.members (join_id, position);
-- A member's join on its own row too (rota.members.join_id, kept equal), so
-- that its completion counts the join down from the row it deletes anyway,
-- without looking the member up (0046).
ALTER TABLE rota.tasks ADD COLUMN join_id uuid;

-- Dead tasks by age: a small index (dead ones only) keeps their retention
-- duty (rota.prune_dead) off the wide table's pages.
CREATE INDEX tasks_dead ON rota.tasks (finished_at) WHERE status = 'dead';

-- How far maintenance may go when its caller is not an admin (a worker role,
-- whose task handlers may be hostile): retention deletes no younger history
-- than these, whatever interval it is given. One row; admins change it.
CREATE TABLE rota.limits (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    finished_retention_floor interval NOT NULL DEFAULT '1 day',
    dead_retention_floor interval NOT NULL DEFAULT '7 days',
    worker_retention_floor interval NOT NULL DEFAULT '1 hour'
);
INSERT INTO rota.limits DEFAULT VALUES;

-- Operations (rota/core/admin.py): every action is recorded here, with who
-- did it, to what, and to how many tasks.
CREATE TABLE rota.audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,  -- 'task', 'queue:NAME', 'tenant:NAME', 'dead', ...
    detail jsonb NOT NULL DEFAULT '{}',
    count bigint NOT NULL
);
CREATE INDEX audit_at ON rota.audit (at);
-- A task's actions, for its history.
CREATE INDEX audit_task_ids ON rota.audit USING gin ((detail -> 'ids'));

CREATE INDEX tasks_cancelled ON rota.tasks (finished_at) WHERE status = 'cancelled';

-- Service per minute, queue and tenant, counted from rota.finished by a
-- maintenance duty (rota.count_service): what the console's throughput and
-- fair-share figures read, without touching the claim's path.
CREATE TABLE rota.service (
    minute timestamptz NOT NULL,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    completed integer NOT NULL,
    wait_seconds double precision NOT NULL,  -- summed enqueue -> start waits
    PRIMARY KEY (minute, queue_id, tenant_id),
    -- Its unfinished tasks (in line or claimed) at the minute's last count
    -- (rota.refresh_stats), written when they change and hourly while they
    -- wait: a minute without it has the last one written before it. With
    -- the completions, its demand in the minute.
    pending bigint
);
CREATE INDEX service_tenant_minute ON rota.service (tenant_id, minute);
CREATE TABLE rota.service_counted (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    up_to timestamptz NOT NULL
);

-- The figures the console shows, per queue and tenant, refreshed by a
-- maintenance duty (rota.refresh_stats) rather than counted on every page
-- view: however many consoles are open, the queue tables are read once per
-- interval. `at` says how fresh they are.
CREATE TABLE rota.stats (
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    waiting bigint NOT NULL,
    running bigint NOT NULL,
    scheduled bigint NOT NULL,
    dead bigint NOT NULL,
    -- When the tenant's first task in line in this queue was enqueued.
    oldest_enqueued_at timestamptz,
    -- When rota.service last recorded its unfinished tasks (waiting +
    -- running): the history gains a row only when they change, or hourly
    -- while they stay, and readers carry the last one forward.
    recorded_at timestamptz,
    -- The place of its first task in line (whose enqueue is the oldest).
    first_vtime double precision,
    -- Claimed, not started (prefetched): its claims beyond those running
    -- (rota.claims). running + prefetched: every claim.
    prefetched bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue_id, tenant_id)
);
-- When rota.stats was last counted.
CREATE TABLE rota.stats_counted (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    at timestamptz NOT NULL
);

-- Per minute and queue: the figures of rota.stats as last counted in that
-- minute and their largest, the completions (rota.service) and deaths in
-- it, and its fair level. A day is kept.
CREATE TABLE rota.queue_history (
    minute timestamptz NOT NULL,
    queue_id integer NOT NULL,
    waiting bigint NOT NULL,
    running bigint NOT NULL,
    oldest_wait_seconds double precision,
    completed bigint NOT NULL DEFAULT 0,
    died bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue_id),
    -- The gauges' largest counts in the minute (the columns above: the last).
    waiting_max bigint,
    running_max bigint,
    oldest_wait_max double precision,
    -- Max-min fair level of the minute's completions (rota.refresh_stats).
    fair_level double precision
);

-- Results, kept for the tasks that ask for them (`@app.task(result_ttl=...)`):
-- the return value as JSON, or why it was refused (too big, not JSON), until
-- it expires. Written with the completion, in its transaction; a waiter is
-- woken by NOTIFY on rota_results with the task's id.
CREATE TABLE rota.results (
    task_id uuid PRIMARY KEY,
    value jsonb,  -- NULL when refused, or once expired
    refused text,  -- why no value is kept: it was too big, or not JSON
    expires_at timestamptz NOT NULL
);
CREATE INDEX results_expire ON rota.results (expires_at) WHERE value IS NOT NULL;
-- Expired results keep their row (it tells "expired" from "unknown") while
-- their task's record lasts.
CREATE INDEX results_expired ON rota.results (task_id) WHERE value IS NULL;

-- The last progress a task reported (rota.context().progress): written by its
-- worker at most about once a second (rota.report_progress), kept after the
-- task ends for as long as its record (retention prunes it with the record).
CREATE TABLE rota.progress (
    task_id uuid PRIMARY KEY,
    attempt integer NOT NULL,  -- the attempt that reported it
    done double precision NOT NULL CONSTRAINT progress_done_bounded
        CHECK (done >= 0 AND done < 'Infinity'),
    total double precision CONSTRAINT progress_total_bounded
        CHECK (total >= done AND total < 'Infinity'),
    message text CONSTRAINT progress_message_bounded CHECK (length(message) <= 500),
    reported_at timestamptz NOT NULL DEFAULT now(),
    -- Times a worker stored it: at most one a flush (about one a second).
    writes bigint NOT NULL DEFAULT 1
);

-- Each limit with its keys' counters: running, parked, and the key with the
-- most running, for `rota limit list` and the console.
CREATE VIEW rota.limit_usage AS
SELECT l.name, l.concurrency_limit, l.rate_limit, l.rate_burst, l.declared, l.updated_at,
       count(k.id) AS keys,
       coalesce(sum(k.running), 0) AS running,
       coalesce(max(k.running), 0) AS busiest_running,
       (SELECT count(*) FROM rota.parked p JOIN rota.keys pk ON pk.id = p.key_id
        WHERE pk.limit_id = l.id) AS parked
FROM rota.key_limits l LEFT JOIN rota.keys k ON k.limit_id = l.id
GROUP BY l.id;
