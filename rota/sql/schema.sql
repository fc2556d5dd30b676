-- rota: the current schema, for fresh databases (`rota migrate`). Every change here
-- also gets a migration in migrations/; a test checks that both agree.
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
-- pairs (rota.lock_tags): loads of one tenant take turns, loads of others
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
    key_id integer
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
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    -- The task's attempts allowed and cost (NULL: finished before they were kept).
    max_attempts integer,
    cost double precision
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
-- each executor loads its partition in a transaction with its row.
CREATE TABLE rota.loader_batches (
    query text NOT NULL,  -- the streaming query's checkpoint: batch ids restart with it
    batch_id bigint NOT NULL,
    tasks integer NOT NULL,
    loaded_at timestamptz NOT NULL DEFAULT now(),
    part integer NOT NULL DEFAULT 0,  -- the partition: a buffer shard
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
    heartbeat_seconds double precision  -- how often it beats
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

-- The queue's virtual clock: the smallest start tag still waiting, or the
-- largest ever given when nothing waits (each tenant's largest, through an
-- index; never below the queue's floor). Read without a lock: a load places
-- its tenants after locking their tags, whatever other tenants' loads do.
-- plpgsql, as is lock_tags: its plan is kept for the session, where a sql
-- function that cannot be inlined (a definer) plans its statement on every
-- call of every load.
CREATE FUNCTION rota.vclock(p_queue_id integer) RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce(
        (SELECT r.vtime FROM rota.ready r WHERE r.queue_id = p_queue_id ORDER BY r.vtime LIMIT 1),
        greatest(
            (SELECT q.max_start FROM rota.queues q WHERE q.id = p_queue_id),
            (SELECT tq.last_start FROM rota.tenant_queues tq WHERE tq.queue_id = p_queue_id
             ORDER BY tq.last_start DESC LIMIT 1)),
        0);
END
$$;

-- Locks the tag rows of (queue, tenant) pairs, creating those missing, in
-- (queue, tenant) order: every writer of fair tags takes them the same way,
-- so loads never deadlock; loads of other tenants never wait. ON CONFLICT
-- ... WHERE false locks an existing row without writing it. A statement of
-- its own, before the placement's: that one then sees the rows made here.
CREATE FUNCTION rota.lock_tags(p_queue_ids integer[], p_tenant_ids integer[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
    SELECT p.q, p.t, 0 FROM unnest(p_queue_ids, p_tenant_ids) AS p(q, t) ORDER BY 1, 2
    ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = tq.finish_tag WHERE false;
END
$$;

-- The ids of queue and tenant names, in the order given; unknown ones are
-- created, in name order (loaders creating the same ones cannot deadlock).
CREATE FUNCTION rota.name_ids(p_queues text[], p_tenants text[],
                              OUT queue_ids integer[], OUT tenant_ids integer[])
LANGUAGE plpgsql
-- Index probes whatever the statistics say: planned on a small table, a
-- generic plan would keep scanning it whole once it grows.
SET enable_seqscan = off
AS $$
BEGIN
    -- Lookups are scalar subqueries: each an index probe (joins could be
    -- planned as a scan of the whole table per name).
    INSERT INTO rota.queues (name)
    SELECT DISTINCT n FROM unnest(p_queues) n
    WHERE (SELECT q.id FROM rota.queues q WHERE q.name = n) IS NULL
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO rota.tenants (name)
    SELECT DISTINCT n FROM unnest(p_tenants) n
    WHERE (SELECT t.id FROM rota.tenants t WHERE t.name = n) IS NULL
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    queue_ids := ARRAY(
        SELECT (SELECT q.id FROM rota.queues q WHERE q.name = x.name)
        FROM unnest(p_queues) WITH ORDINALITY x(name, i) ORDER BY x.i);
    tenant_ids := ARRAY(
        SELECT (SELECT t.id FROM rota.tenants t WHERE t.name = x.name)
        FROM unnest(p_tenants) WITH ORDINALITY x(name, i) ORDER BY x.i);
END
$$;

-- Where each (queue, tenant) pair's next task starts, S = max(V, F) (the
-- queue's virtual clock, the tenant's finish tag), and the tenant's weight.
-- Called once the pairs' tags are locked (rota.lock_tags): loads of the same
-- tenant take turns, each reading settled tags, until they commit.
CREATE FUNCTION rota.fair_starts(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS TABLE (queue_id integer, tenant_id integer, weight double precision,
               start double precision)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v, q.charge_time, q.run_seconds
        FROM (SELECT DISTINCT unnest(p_queue_ids) AS id) x JOIN rota.queues q ON q.id = x.id
    )
    SELECT p.queue_id, p.tenant_id,
           -- Charged by time, a task costs its pair's seconds per run: the
           -- weight is divided by them (placement divides cost by weight).
           (SELECT t.weight FROM rota.tenants t WHERE t.id = p.tenant_id)
               / CASE WHEN c.charge_time
                      THEN greatest(coalesce((SELECT tq.run_seconds FROM rota.tenant_queues tq
                                              WHERE tq.queue_id = p.queue_id
                                                AND tq.tenant_id = p.tenant_id),
                                             c.run_seconds, 1), 1e-6)
                      ELSE 1 END,
           greatest(c.v, coalesce((SELECT tq.finish_tag FROM rota.tenant_queues tq
                                   WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id),
                                  c.v))
    FROM unnest(p_queue_ids, p_tenant_ids) AS p(queue_id, tenant_id)
    JOIN clock c ON c.id = p.queue_id;
END
$$;

-- Takes claimed tasks off the running table, keeping each limited tenant's
-- and key's counter right. Tenant rows, then key rows, are locked in id
-- order, as claims lock them.
-- One statement: plpgsql keeps its plan, where a sql function would plan it
-- on every call (this runs on every completion). A hash join of the tokens:
-- planned on a near-empty running table, the join became a nested loop that
-- compared every running row with every token (2 ms for 100 completions, and
-- quadratic in a mass requeue).
CREATE FUNCTION rota.take_running(p_ids uuid[], p_attempts integer[])
RETURNS SETOF rota.running
LANGUAGE plpgsql SET enable_nestloop = off AS $$
DECLARE
    -- Set by rota.check_worker: a worker takes only what it holds.
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');
BEGIN
    RETURN QUERY
    WITH taken AS MATERIALIZED (
        DELETE FROM rota.running r
        USING unnest(p_ids, p_attempts) AS x(id, attempt)
        -- The ANY keeps the planner on the key however many tasks are running.
        WHERE r.task_id = ANY (p_ids) AND r.task_id = x.id
          -- A worker's report (an attempt token) counts only within its
          -- lease: past it the worker holds nothing (the task is requeued
          -- and may run elsewhere), whatever kept it silent.
          AND (x.attempt IS NULL OR (r.attempt = x.attempt AND r.lease_expires_at > now()))
          AND (v_worker IS NULL OR r.worker = v_worker)
        RETURNING r.*
    ), counted AS (
        SELECT tenant_id, count(*) AS n FROM taken WHERE counted GROUP BY tenant_id
    ), locked AS MATERIALIZED (
        -- Nothing is locked when no limited tenant is among them.
        SELECT t.id FROM rota.tenants t
        WHERE t.id = ANY (ARRAY(SELECT tenant_id FROM counted))
        ORDER BY t.id FOR UPDATE
    ), uncounted AS (
        UPDATE rota.tenants t SET running = greatest(t.running - c.n, 0)
        FROM counted c
        WHERE t.id = ANY (ARRAY(SELECT id FROM locked)) AND t.id = c.tenant_id
    ), keys_counted AS (
        SELECT key_id, count(*) AS n FROM taken WHERE key_id IS NOT NULL GROUP BY key_id
    ), keys_locked AS MATERIALIZED (
        -- After the tenants' rows (the subquery on `locked` runs first), as
        -- claims lock them; nothing is locked when no key counts.
        SELECT k.id FROM rota.keys k
        WHERE k.id = ANY (ARRAY(SELECT key_id FROM keys_counted))
          AND (SELECT count(*) FROM locked) >= 0
        ORDER BY k.id FOR UPDATE
    ), keys_uncounted AS (
        UPDATE rota.keys k SET running = greatest(k.running - c.n, 0)
        FROM keys_counted c
        WHERE k.id = ANY (ARRAY(SELECT id FROM keys_locked)) AND k.id = c.key_id
    )
    SELECT * FROM taken;
END
$$;

-- rota.complete's work, saying of each task completed whether its tenant's
-- running counter counted it (its tenant row was locked to uncount it).
CREATE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key: a join on
    -- a function's result is estimated at 1000 rows and turns into a seq scan.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT r.task_id, r.queue_id, r.tenant_id, r.attempt, r.claimed_at, r.counted, r.key_id
        FROM rota.take_running(p_ids, p_attempts) r
    ), gone AS (
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT d.task_id FROM done d))
        RETURNING t.id, t.enqueued_at, t.max_attempts, t.cost
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                                   max_attempts, cost)
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at, d.claimed_at,
               g.max_attempts, g.cost
        FROM done d JOIN gone g ON g.id = d.task_id
        RETURNING task_id
    ), released AS (
        -- The joins whose last member this was: due now (still waiting, not
        -- dead or cancelled meanwhile).
        -- The countdown drives the statement (a function scan), never a
        -- subquery that the plan may skip; it runs only while some join
        -- waits (one probe of joins_waiting otherwise).
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now(), j.id
        FROM (SELECT WHERE EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)) gate,
             LATERAL rota.count_down_joins(ARRAY(SELECT task_id FROM done)) AS j(id)
        WHERE (SELECT t.status FROM rota.tasks t WHERE t.id = j.id) = 'scheduled'
    )
    SELECT s.task_id, d.counted OR d.key_id IS NOT NULL
    FROM stored s JOIN done d ON d.task_id = s.task_id;
END
$$;

-- Finishes claimed tasks successfully: they leave rota.tasks (a delete is far
-- cheaper than rewriting the wide row) for the narrow rota.finished log.
-- Returns the ids completed; an id whose attempt token is stale (the lease
-- expired and the task was given to someone else) is refused and left alone.
CREATE FUNCTION rota.complete(p_ids uuid[], p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT c.task_id FROM rota.complete_counted(p_ids, p_attempts) c;
END
$$;

-- Hands back claimed tasks whose name the worker's app does not know, for a
-- worker that knows it: each runs again p_delay seconds later with no attempt
-- used, until it has been unknown for p_grace seconds; then it is dead with
-- p_reason. Stale tokens are refused.
CREATE FUNCTION rota.defer_unknown(
    p_ids uuid[], p_attempts integer[], p_delay double precision, p_grace double precision,
    p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH taken AS MATERIALIZED (
        SELECT r.task_id, r.attempt FROM rota.take_running(p_ids, p_attempts) r
    ), decided AS MATERIALIZED (
        SELECT t.id, k.attempt,
               coalesce(t.unknown_since, now()) <= now() - make_interval(secs => p_grace)
                   AS give_up
        FROM rota.tasks t JOIN taken k ON k.task_id = t.id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM taken))
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now() + make_interval(secs => p_delay), d.id FROM decided d WHERE NOT d.give_up
    )
    UPDATE rota.tasks t
    SET status = CASE WHEN d.give_up THEN 'dead' ELSE 'scheduled' END::rota.task_status,
        unknown_since = coalesce(t.unknown_since, now()),
        attempts = CASE WHEN d.give_up THEN d.attempt ELSE t.attempts END,
        last_error = p_reason,
        finished_at = CASE WHEN d.give_up THEN now() END
    FROM decided d
    WHERE t.id = ANY (ARRAY(SELECT id FROM decided)) AND t.id = d.id
    RETURNING t.id, t.status;
END
$$;

-- Fails claimed tasks: each is retried after its backoff (exponential, with
-- jitter), or at p_retry_at when given (an explicit retry), until its last
-- attempt; then, or at once when p_final (an unknown task, say), it is dead,
-- with its last error and traceback kept. A task cancelled while it ran ends
-- as 'cancelled' instead. Stale tokens are refused.
CREATE FUNCTION rota.fail(
    p_ids uuid[], p_attempts integer[], p_errors text[], p_retry_at timestamptz[],
    p_final boolean[], p_tracebacks text[] DEFAULT NULL
) RETURNS TABLE (id uuid, status rota.task_status, run_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH failed AS MATERIALIZED (
        SELECT r.task_id, r.attempt, x.error, x.retry_at, x.final, x.traceback
        FROM rota.take_running(p_ids, p_attempts) r
        -- A NULL p_tracebacks unnests as NULLs beside the other arrays.
        JOIN unnest(p_ids, p_errors, p_retry_at, p_final, p_tracebacks)
             AS x(id, error, retry_at, final, traceback)
          ON x.id = r.task_id
    ), decided AS (
        SELECT f.task_id, f.attempt, f.error, f.traceback, t.cancel_requested,
               CASE WHEN f.final OR t.cancel_requested OR f.attempt >= t.max_attempts THEN NULL
                    ELSE coalesce(f.retry_at, now() + make_interval(secs =>
                        rota.backoff_seconds(f.attempt, t.backoff_base, t.backoff_max)))
               END AS run_at
        FROM failed f JOIN rota.tasks t ON t.id = f.task_id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM failed))
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT d.run_at, d.task_id FROM decided d WHERE d.run_at IS NOT NULL
    )
    UPDATE rota.tasks t
    SET status = CASE WHEN d.cancel_requested THEN 'cancelled'
                      WHEN d.run_at IS NULL THEN 'dead'
                      ELSE 'scheduled' END::rota.task_status,
        attempts = d.attempt, last_error = d.error, traceback = d.traceback,
        finished_at = CASE WHEN d.run_at IS NULL THEN now() END
    FROM decided d
    WHERE t.id = ANY (ARRAY(SELECT task_id FROM failed)) AND t.id = d.task_id
    RETURNING t.id, t.status, d.run_at;
END
$$;

-- Exponential backoff with "equal jitter": half the delay fixed, half random,
-- so that a burst of failures does not retry in lockstep.
CREATE FUNCTION rota.backoff_seconds(p_attempt integer, p_base double precision, p_max double precision)
RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT d / 2 + random() * d / 2
    FROM (SELECT least(p_max, p_base * power(2, least(p_attempt - 1, 60))) AS d) x
$$;

-- Puts claimed tasks back in line at the place they had. p_consume says
-- whether the attempt counts: it does for an expired lease or a dead worker
-- (the task may have run), not for a task handed back unstarted at shutdown.
-- A task out of attempts is dead instead, and one cancelled while it ran is
-- cancelled. Returns the ids put back in line.
CREATE FUNCTION rota.requeue(p_ids uuid[], p_attempts integer[], p_consume boolean, p_reason text)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows rota.running[];
BEGIN
    SELECT array_agg(r) INTO v_rows FROM rota.take_running(p_ids, p_attempts) r;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    IF p_consume THEN
        UPDATE rota.tasks t
        SET attempts = r.attempt, last_error = p_reason,
            status = CASE WHEN r.attempt >= t.max_attempts THEN 'dead' ELSE t.status END,
            finished_at = CASE WHEN r.attempt >= t.max_attempts THEN now() END
        FROM unnest(v_rows) r
        WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x)) AND t.id = r.task_id;
    END IF;
    UPDATE rota.tasks t SET status = 'cancelled', finished_at = now()
    WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x))
      AND t.cancel_requested AND t.status = 'pending';

    RETURN QUERY
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
    SELECT r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id, r.priority
    FROM unnest(v_rows) r JOIN rota.tasks t ON t.id = r.task_id
    WHERE t.id = ANY (ARRAY(SELECT (x).task_id FROM unnest(v_rows) x)) AND t.status = 'pending'
    RETURNING task_id;

    PERFORM pg_notify('rota_ready', q.name)
    FROM rota.queues q WHERE q.id IN (SELECT r.queue_id FROM unnest(v_rows) r);
END
$$;

-- Requeues the tasks whose lease ran out. Without attempt tokens, which
-- count only within a lease (rota.take_running); none is needed: a passed
-- lease's row can no longer change but by its requeue.
CREATE FUNCTION rota.requeue_expired() RETURNS SETOF uuid
LANGUAGE sql AS $$
    SELECT rota.requeue(array_agg(task_id), array_fill(NULL::integer, ARRAY[count(*)::integer]),
                        true, 'lease expired')
    FROM rota.running WHERE lease_expires_at < now()
$$;

-- Creates or changes a tenant. The running counter is recounted when a
-- concurrency limit is set; a fresh rate limit starts with a full bucket.
CREATE FUNCTION rota.configure_tenant(
    p_name text, p_weight double precision, p_concurrency_limit integer,
    p_rate_limit double precision, p_rate_burst double precision, p_capacity bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    INSERT INTO rota.tenants (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT id INTO v_id FROM rota.tenants WHERE name = p_name FOR UPDATE;
    UPDATE rota.running SET counted = (p_concurrency_limit IS NOT NULL) WHERE tenant_id = v_id;
    UPDATE rota.tenants SET
        weight = p_weight,
        concurrency_limit = p_concurrency_limit,
        rate_limit = p_rate_limit,
        rate_burst = coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1))),
        capacity = p_capacity,
        running = CASE WHEN p_concurrency_limit IS NULL THEN 0
                       ELSE (SELECT count(*) FROM rota.running r WHERE r.tenant_id = v_id) END,
        tokens = coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1))),
        refilled_at = now()
    WHERE id = v_id;
    RETURN v_id;
END
$$;

-- How much work (in cost units) each tenant has waiting, estimated from the
-- fair tags: a tenant's finish tag runs ahead of the clock by its backlog
-- divided by its weight. O(1) per tenant, for backpressure.
CREATE VIEW rota.tenant_backlog AS
SELECT t.name AS tenant, t.capacity,
       coalesce(sum(greatest(0, tq.finish_tag - c.clock) * t.weight), 0) AS backlog
FROM rota.tenants t
LEFT JOIN rota.tenant_queues tq ON tq.tenant_id = t.id
-- Each queue's clock once, not once per (queue, tenant) pair.
LEFT JOIN (SELECT q.id, rota.vclock(q.id) AS clock FROM rota.queues q) c ON c.id = tq.queue_id
GROUP BY t.id;

-- Claims up to `limit` ready tasks of the given queues in fair order, in one
-- statement. Paused queues are not read; paused tenants, and tenants at their
-- concurrency limit or out of rate tokens, are skipped by the scan; the
-- admission below is the race-proof check. Tenants without limits (most)
-- skip the admission's locking, counting and ranking.
-- SECURITY DEFINER: a worker's role claims through it, holding no direct
-- UPDATE or DELETE on the tables.
-- A tenant's tokens now: its rate limit's bucket, refilled since it was last
-- charged, up to its burst; NULL without a rate limit (least() would skip a
-- NULL, so the CASE keeps it). Plain SQL, so the planner inlines it.
CREATE FUNCTION rota.tokens_now(p_rate double precision, p_burst double precision,
                                p_tokens double precision, p_refilled_at timestamptz)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_rate IS NOT NULL
                THEN least(p_burst, p_tokens + p_rate * extract(epoch FROM now() - p_refilled_at))
           END
$$;

CREATE FUNCTION rota.claim(p_queues text[], p_limit integer, p_worker text,
                           p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    -- Priority (docs/architecture.md, "Fairness") is looked at only when
    -- these queues hold an urgent task at all (one probe of the partial
    -- index ready_urgent): claims without any run the plain query.
    IF NOT EXISTS (SELECT FROM rota.queues q JOIN rota.ready x ON x.queue_id = q.id
                   WHERE q.name = ANY (p_queues) AND x.priority > 0) THEN
        RETURN QUERY
        WITH limits AS MATERIALIZED (
            -- Every limited tenant (the partial index holds only those), and those
            -- that cannot take a task now.
            SELECT coalesce(array_agg(t.id), '{}') AS limited,
                   coalesce(array_agg(t.id) FILTER (
                       WHERE t.paused
                          OR t.running >= t.concurrency_limit
                          OR rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) < 1),
                       '{}') AS blocked
            FROM rota.tenants t
            WHERE t.limited
        ), candidates AS MATERIALIZED (
            SELECT c.*, q.name AS queue
            FROM rota.queues q
            CROSS JOIN LATERAL (
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
                FROM rota.ready r
                -- `+ 0` hides the column's statistics from this filter: when one
                -- tenant holds the whole backlog they make the planner expect no row
                -- to pass it, and it then sorts a seq scan of ready on every claim.
                WHERE r.queue_id = q.id AND r.tenant_id + 0 <> ALL ((SELECT blocked FROM limits)::integer[])
                ORDER BY r.vtime, r.tenant_id, r.seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) c
            WHERE q.name = ANY (p_queues) AND NOT q.paused
            ORDER BY c.vtime, c.tenant_id, c.seq
            LIMIT p_limit
        ), limited AS MATERIALIZED (
            -- The candidates' limited tenants, locked in id order, as every writer of
            -- tenant counters locks them; FOR UPDATE reads the latest committed
            -- counters, so racing claims cannot both take the last free slot.
            SELECT t.id,
                   t.concurrency_limit - t.running AS free_slots,
                   rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) AS tokens
            FROM rota.tenants t
            WHERE t.limited AND t.id = ANY (ARRAY(
                SELECT DISTINCT c.tenant_id FROM candidates c
                WHERE c.tenant_id = ANY ((SELECT limited FROM limits)::integer[])))
            ORDER BY t.id
            FOR UPDATE
        ), admitted AS MATERIALIZED (
            -- Unlimited tenants' candidates as they are; a limited tenant's, in its
            -- order, as many as it has free slots and tokens.
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   false AS counted
            FROM candidates c
            WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
            UNION ALL
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   l.free_slots IS NOT NULL
            FROM (
                SELECT candidates.*,
                       row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
                FROM candidates
                WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
            ) c
            JOIN limited l ON l.id = c.tenant_id
            WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))
        ), taken AS (
            -- Parked ones too: they leave the line.
            DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM admitted))
        ), claimed AS MATERIALIZED (
            SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority, a.counted,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at, t.limit_key
            FROM rota.tasks t
            JOIN admitted a ON a.task_id = t.id
            WHERE t.id = ANY (ARRAY(SELECT task_id FROM admitted))
        ), keyed AS MATERIALIZED (
            SELECT c.* FROM claimed c WHERE c.limit_key IS NOT NULL
        ), key_fit AS MATERIALIZED (
            -- Limits on keys (rota.key_admit) for the claimed tasks that name
            -- a key, only in queues holding such tasks: the function, its
            -- tables and their locks are not reached otherwise. Tenant rows
            -- are locked first (the subquery on `limited`).
            SELECT f.*
            FROM (SELECT WHERE EXISTS (SELECT FROM rota.queues q
                                       WHERE q.name = ANY (p_queues) AND q.key_limited)
                           AND (SELECT count(*) FROM limited) >= 0) gate,
                 LATERAL rota.key_admit(
                     ARRAY(SELECT c.task_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.limit_key FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.queue_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.vtime FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.tenant_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.seq FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.priority FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq)) f
        ), final AS MATERIALIZED (
            -- The claimed tasks that fit (a parked one leaves the line, not
            -- for a worker). The gate makes key_fit run even when nothing
            -- was claimed: it brings back parked tasks whose key has room.
            SELECT c.*, f.key_id
            FROM claimed c LEFT JOIN key_fit f ON f.task_id = c.task_id
            WHERE f.fits IS NOT false AND (SELECT count(*) FROM key_fit) >= 0
        ), charged AS (
            UPDATE rota.tenants t
            SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
                tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
                refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
            FROM (SELECT tenant_id, count(*) AS n FROM final GROUP BY tenant_id) a
            JOIN limited l ON l.id = a.tenant_id
            -- The ANY keeps the planner on the key, even with a plan made on few tenants.
            WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority, key_id)
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority, key_id
            FROM final
        )
        SELECT c.task_id AS id, c.name, c.payload::text, c.queue,
               -- Looked up only for tasks stored before the name was copied to them.
               coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
                   AS tenant,
               c.attempt,
               c.max_attempts, c.lease_expires_at, c.enqueued_at
        FROM final c
        ORDER BY c.vtime, c.tenant_id, c.seq;
    ELSE
        RETURN QUERY
        WITH limits AS MATERIALIZED (
            -- Every limited tenant (the partial index holds only those), and those
            -- that cannot take a task now.
            SELECT coalesce(array_agg(t.id), '{}') AS limited,
                   coalesce(array_agg(t.id) FILTER (
                       WHERE t.paused
                          OR t.running >= t.concurrency_limit
                          OR rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) < 1),
                       '{}') AS blocked
            FROM rota.tenants t
            WHERE t.limited
        ), candidates AS MATERIALIZED (
            SELECT c.*, q.name AS queue
            FROM rota.queues q
            CROSS JOIN LATERAL (
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
                FROM rota.ready r
                -- `+ 0` hides the column's statistics from this filter: when one
                -- tenant holds the whole backlog they make the planner expect no row
                -- to pass it, and it then sorts a seq scan of ready on every claim.
                WHERE r.queue_id = q.id AND r.tenant_id + 0 <> ALL ((SELECT blocked FROM limits)::integer[])
                ORDER BY r.vtime, r.tenant_id, r.seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) c
            WHERE q.name = ANY (p_queues) AND NOT q.paused
            ORDER BY c.vtime, c.tenant_id, c.seq
            LIMIT p_limit
        ), limited AS MATERIALIZED (
            -- The candidates' limited tenants, locked in id order, as every writer of
            -- tenant counters locks them; FOR UPDATE reads the latest committed
            -- counters, so racing claims cannot both take the last free slot.
            SELECT t.id,
                   t.concurrency_limit - t.running AS free_slots,
                   rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) AS tokens
            FROM rota.tenants t
            WHERE t.limited AND t.id = ANY (ARRAY(
                SELECT DISTINCT c.tenant_id FROM candidates c
                WHERE c.tenant_id = ANY ((SELECT limited FROM limits)::integer[])))
            ORDER BY t.id
            FOR UPDATE
        ), admitted AS MATERIALIZED (
            -- Unlimited tenants' candidates as they are; a limited tenant's, in its
            -- order, as many as it has free slots and tokens.
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   false AS counted
            FROM candidates c
            WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
            UNION ALL
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   l.free_slots IS NOT NULL
            FROM (
                SELECT candidates.*,
                       row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
                FROM candidates
                WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
            ) c
            JOIN limited l ON l.id = c.tenant_id
            WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))
        ), urgent AS MATERIALIZED (
            -- Priority (docs/architecture.md, "Fairness"): the slots are the
            -- admitted ones; a tenant's own waiting tasks of a higher priority
            -- than a slot's task may take it. Per admitted tenant and queue, at
            -- most as many as its slots, best first, from the partial index
            -- ready_urgent.
            SELECT u.row_id, u.queue_id, u.vtime, u.tenant_id, u.seq, u.task_id, u.priority
            FROM (SELECT a.queue_id, a.tenant_id, count(*) AS slots, min(a.priority) AS lowest
                  FROM admitted a GROUP BY a.queue_id, a.tenant_id) s
            CROSS JOIN LATERAL (
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
                FROM rota.ready r
                WHERE r.queue_id = s.queue_id AND r.tenant_id = s.tenant_id
                  AND r.priority > 0 AND r.priority > s.lowest
                  AND r.ctid <> ALL (ARRAY(SELECT a.row_id FROM admitted a))
                ORDER BY r.priority DESC, r.vtime, r.seq
                LIMIT s.slots
                FOR UPDATE SKIP LOCKED
            ) u
        ), ranked AS MATERIALIZED (
            -- A tenant's slots go to its best tasks among its admitted and urgent
            -- ones: highest priority first, then earliest in line.
            SELECT p.*,
                   row_number() OVER (PARTITION BY p.queue_id, p.tenant_id
                                      ORDER BY p.priority DESC, p.vtime, p.seq) AS best,
                   count(*) FILTER (WHERE p.slot) OVER (PARTITION BY p.queue_id, p.tenant_id)
                       AS slots
            FROM (
                SELECT a.row_id, a.queue_id, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority,
                       true AS slot
                FROM admitted a
                WHERE (a.queue_id, a.tenant_id) IN (SELECT u.queue_id, u.tenant_id FROM urgent u)
                UNION ALL
                SELECT u.row_id, u.queue_id, u.vtime, u.tenant_id, u.seq, u.task_id, u.priority, false
                FROM urgent u
            ) p
        ), swaps AS MATERIALIZED (
            -- Each admitted task that lost its slot pairs with an urgent task that
            -- won one, the earliest slot with the best: the urgent task runs in
            -- the slot (and keeps the slot's place while it runs), the other
            -- waits at the urgent task's place. The tenant's places, and so its
            -- share, are unchanged.
            SELECT l.row_id AS slot_row, w.row_id, w.vtime, w.seq, w.task_id, w.priority
            FROM (SELECT r.row_id, r.queue_id, r.tenant_id,
                         row_number() OVER (PARTITION BY r.queue_id, r.tenant_id
                                            ORDER BY r.vtime, r.seq) AS n
                  FROM ranked r WHERE r.slot AND r.best > r.slots) l
            JOIN (SELECT r.*,
                         row_number() OVER (PARTITION BY r.queue_id, r.tenant_id
                                            ORDER BY r.best) AS n
                  FROM ranked r WHERE NOT r.slot AND r.best <= r.slots) w
              ON w.queue_id = l.queue_id AND w.tenant_id = l.tenant_id AND w.n = l.n
        ), picked AS MATERIALIZED (
            -- The tasks claimed: the admitted ones, but in a swapped slot its urgent task.
            SELECT a.row_id, a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority,
                   a.counted
            FROM admitted a
            WHERE a.row_id <> ALL (ARRAY(SELECT s.slot_row FROM swaps s))
            UNION ALL
            SELECT s.row_id, a.queue_id, a.queue, a.vtime, a.tenant_id, s.seq, s.task_id, s.priority,
                   a.counted
            FROM swaps s JOIN admitted a ON a.row_id = s.slot_row
        ), taken AS (
            -- The displaced tasks' rows go too, and come back at their new
            -- places (moved): a row of ready is never updated in place, so a
            -- racing claim's SKIP LOCKED skips it rather than following it to
            -- a new version that its row ids (ctid) would not name.
            DELETE FROM rota.ready
            WHERE ctid = ANY (ARRAY(SELECT row_id FROM picked UNION ALL
                                    SELECT slot_row FROM swaps))
        ), moved AS (
            INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
            SELECT a.queue_id, s.vtime, a.tenant_id, a.seq, a.task_id, a.priority
            FROM swaps s JOIN admitted a ON a.row_id = s.slot_row
        ), claimed AS MATERIALIZED (
            SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority, a.counted,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at, t.limit_key
            FROM rota.tasks t
            JOIN picked a ON a.task_id = t.id
            WHERE t.id = ANY (ARRAY(SELECT task_id FROM picked))
        ), keyed AS MATERIALIZED (
            SELECT c.* FROM claimed c WHERE c.limit_key IS NOT NULL
        ), key_fit AS MATERIALIZED (
            -- Limits on keys (rota.key_admit) for the claimed tasks that name
            -- a key, only in queues holding such tasks: the function, its
            -- tables and their locks are not reached otherwise. Tenant rows
            -- are locked first (the subquery on `limited`).
            SELECT f.*
            FROM (SELECT WHERE EXISTS (SELECT FROM rota.queues q
                                       WHERE q.name = ANY (p_queues) AND q.key_limited)
                           AND (SELECT count(*) FROM limited) >= 0) gate,
                 LATERAL rota.key_admit(
                     ARRAY(SELECT c.task_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.limit_key FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.queue_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.vtime FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.tenant_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.seq FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.priority FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq)) f
        ), final AS MATERIALIZED (
            -- The claimed tasks that fit (a parked one leaves the line, not
            -- for a worker). The gate makes key_fit run even when nothing
            -- was claimed: it brings back parked tasks whose key has room.
            SELECT c.*, f.key_id
            FROM claimed c LEFT JOIN key_fit f ON f.task_id = c.task_id
            WHERE f.fits IS NOT false AND (SELECT count(*) FROM key_fit) >= 0
        ), charged AS (
            UPDATE rota.tenants t
            SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
                tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
                refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
            FROM (SELECT tenant_id, count(*) AS n FROM final GROUP BY tenant_id) a
            JOIN limited l ON l.id = a.tenant_id
            -- The ANY keeps the planner on the key, even with a plan made on few tenants.
            WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority, key_id)
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority, key_id
            FROM final
        )
        SELECT c.task_id AS id, c.name, c.payload::text, c.queue,
               -- Looked up only for tasks stored before the name was copied to them.
               coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
                   AS tenant,
               c.attempt,
               c.max_attempts, c.lease_expires_at, c.enqueued_at
        FROM final c
        ORDER BY c.vtime, c.tenant_id, c.seq;
    END IF;
END
$$;

-- Completes claimed tasks (stale tokens refused), then claims up to p_limit
-- as rota.claim does. The first row carries the outcome and no task: how many
-- were completed, and whether the claim ran. It does not run when a
-- completion locked a limited tenant's row: a claim locks tenant rows too,
-- and two workers each holding one tenant's lock while the other's claim asks
-- for it would deadlock; the worker then claims in a statement of its own, as
-- separate transactions always could. The claimed tasks follow, in fair order.
CREATE FUNCTION rota.complete_claim(p_ids uuid[], p_attempts integer[], p_queues text[],
                                    p_limit integer, p_worker text,
                                    p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_completed integer;
    v_locked boolean;
BEGIN
    SELECT count(*), coalesce(bool_or(c.counted), false) INTO v_completed, v_locked
    FROM rota.complete_counted(p_ids, p_attempts) c;
    RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz,
                        v_completed, NOT v_locked;
    IF NOT v_locked THEN
        RETURN QUERY SELECT c.*, NULL::integer, NULL::boolean
                     FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds) c;
    END IF;
END
$$;

-- Heartbeat: extends the leases that have not passed; returns the ids still held
-- by these tokens.
CREATE FUNCTION rota.extend_leases(p_ids uuid[], p_attempts integer[],
                                              p_lease_seconds double precision)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');
BEGIN
    RETURN QUERY
    UPDATE rota.running r
    SET lease_expires_at = now() + make_interval(secs => p_lease_seconds)
    FROM unnest(p_ids, p_attempts) AS x(id, attempt)
    WHERE r.task_id = x.id AND r.attempt = x.attempt
      -- A lease that passed is not revived (rota.take_running).
      AND r.lease_expires_at > now()
      AND (v_worker IS NULL OR r.worker = v_worker)
    RETURNING r.task_id;
END
$$;

-- Due scheduled tasks (ETA reached, retry backoff over), back to pending; they
-- get their fair place in line from rota.core.make_ready.
CREATE FUNCTION rota.take_due(p_limit integer)
RETURNS TABLE (id uuid, seq bigint, queue_id integer, tenant_id integer,
               cost double precision, priority smallint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        DELETE FROM rota.scheduled
        WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM rota.scheduled WHERE run_at <= now()
            ORDER BY run_at LIMIT p_limit FOR UPDATE SKIP LOCKED))
        RETURNING task_id
    ), joined AS MATERIALIZED (
        -- Joins run with their members' results before their own arguments.
        SELECT j.task_id FROM rota.joins j WHERE j.task_id = ANY (ARRAY(SELECT task_id FROM due))
    ), promoted AS (
        UPDATE rota.tasks t
        SET status = 'pending',
            payload = CASE WHEN t.id = ANY (ARRAY(SELECT task_id FROM joined))
                           THEN rota.joined_payload(t.id) ELSE t.payload END
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM due)) AND t.status = 'scheduled'
        RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.priority
    )
    SELECT p.id, p.seq, p.queue_id, p.tenant_id, p.cost, p.priority FROM promoted p
    ORDER BY p.seq;
END
$$;

-- A worker's heartbeat: false once it was declared dead (it must stop).
CREATE FUNCTION rota.worker_heartbeat(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE rota.workers SET heartbeat_at = now() WHERE id = p_id AND stopped_at IS NULL;
    RETURN FOUND;
END
$$;

CREATE FUNCTION rota.stop_worker(p_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE rota.workers SET stopped_at = now() WHERE id = p_id
$$;

-- Declares workers dead and requeues their tasks (the attempt counts);
-- returns the ids requeued. Only a worker silent for two of its own
-- heartbeats can be declared dead, whoever asks: a live worker never is.
CREATE FUNCTION rota.reap_workers(p_ids text[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tasks uuid[];
BEGIN
    WITH dead AS (
        UPDATE rota.workers SET stopped_at = now()
        WHERE id = ANY (p_ids) AND stopped_at IS NULL
          AND heartbeat_at < now() - make_interval(secs => 2 * coalesce(heartbeat_seconds, 0))
        RETURNING id
    )
    SELECT array_agg(r.task_id) INTO v_tasks
    FROM rota.running r WHERE r.worker = ANY (ARRAY(SELECT id FROM dead));
    IF v_tasks IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM rota.requeue(
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true, 'worker died');
END
$$;

-- Functions that producers, loaders and workers call run as the schema's
-- owner, with a fixed search_path: those roles hold no UPDATE or DELETE.
ALTER FUNCTION rota.name_ids(text[], text[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.fair_starts(integer[], integer[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.complete(uuid[], integer[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.requeue_expired()
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.defer_unknown(uuid[], integer[], double precision, double precision, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Functions run by anyone with EXECUTE, which PUBLIC has by default: only the
-- roles of `rota migrate --roles` (rota/sql/roles.sql) get it.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
-- The virtual clock is read by the producers' backlog view too.
ALTER FUNCTION rota.vclock(integer) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Retention duties (rota/consumer/maintenance.py): each prunes what no one
-- needs any more, a bounded batch per run, so that the tables keep their size
-- in a long steady run.

-- Dead tasks by age: a small index (dead ones only) keeps the duty off the
-- wide table's pages.
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

-- Whether the session's login may do anything (no roles made, an admin, the
-- owner, a superuser), or is held to rota.limits.
CREATE FUNCTION rota.caller_is_admin() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'rota_admin')
        OR pg_has_role(session_user, 'rota_admin', 'MEMBER')
        OR pg_has_role(session_user, 'rota_owner', 'MEMBER')
$$;

-- The interval a retention duty may use: the caller's, but for a caller held
-- to rota.limits never below the floor.
CREATE FUNCTION rota.retention(p_asked interval, p_floor interval) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN rota.caller_is_admin() THEN p_asked ELSE greatest(p_asked, p_floor) END
$$;

-- Drops up to p_limit records of tasks that succeeded before p_older_than ago.
CREATE FUNCTION rota.prune_finished(p_older_than interval, p_limit integer)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.finished WHERE task_id = ANY (ARRAY(
            SELECT f.task_id FROM rota.finished f
            WHERE f.finished_at < now() - rota.retention(
                p_older_than, (SELECT l.finished_retention_floor FROM rota.limits l))
            LIMIT p_limit))
        RETURNING task_id
    ), unjoined AS (
        DELETE FROM rota.joins WHERE task_id = ANY (ARRAY(SELECT task_id FROM pruned))
    )
    SELECT count(*) FROM pruned
$$;

-- Drops up to p_limit dead or cancelled tasks that ended before p_older_than ago.
CREATE FUNCTION rota.prune_dead(p_older_than interval, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_older_than interval := rota.retention(
        p_older_than, (SELECT l.dead_retention_floor FROM rota.limits l));
    v_count bigint;
BEGIN
    WITH pruned AS (
        DELETE FROM rota.tasks WHERE id = ANY (ARRAY(
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'dead' AND t.finished_at < now() - v_older_than
            UNION ALL
            SELECT t.id FROM rota.tasks t
            WHERE t.status = 'cancelled' AND t.finished_at < now() - v_older_than
            LIMIT p_limit))
        AND status IN ('dead', 'cancelled')
        RETURNING id
    ), unjoined AS (
        DELETE FROM rota.joins WHERE task_id = ANY (ARRAY(SELECT id FROM pruned))
    )
    SELECT count(*) INTO v_count FROM pruned;
    RETURN v_count;
END
$$;

-- Drops the rows of workers stopped (or declared dead) before p_older_than
-- ago that hold no claim.
CREATE FUNCTION rota.prune_workers(p_older_than interval) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.workers w
        WHERE w.stopped_at < now() - rota.retention(
                p_older_than, (SELECT l.worker_retention_floor FROM rota.limits l))
          AND NOT EXISTS (SELECT FROM rota.running r WHERE r.worker = w.id)
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Drops ledger rows no replay can need: Spark replays only a checkpoint's
-- latest batches, so each checkpoint keeps the rows of its newest p_keep
-- batches, and any younger than p_older_than.
CREATE FUNCTION rota.prune_loader_batches(p_older_than interval, p_keep integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH ranked AS (
        SELECT query, batch_id, part, loaded_at,
               dense_rank() OVER (PARTITION BY query ORDER BY batch_id DESC) AS nth
        FROM rota.loader_batches
    ), pruned AS (
        DELETE FROM rota.loader_batches b
        USING ranked r
        WHERE b.query = r.query AND b.batch_id = r.batch_id AND b.part = r.part
          AND r.nth > p_keep AND r.loaded_at < now() - p_older_than
        RETURNING 1
    )
    SELECT count(*) FROM pruned
$$;

-- Claims still held by workers that stopped (or were declared dead) more
-- than p_after ago: a worker that died during its shutdown, or one declared
-- dead that claimed before it learned so. Returns their task ids, to requeue.
CREATE FUNCTION rota.stopped_workers_claims(p_after interval) RETURNS SETOF uuid
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.task_id FROM rota.running r
    JOIN rota.workers w ON w.id = r.worker
    WHERE w.stopped_at < now() - p_after
$$;

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

-- Cancels tasks. A waiting one (ready or scheduled) is cancelled at once; a
-- running one when its attempt ends (it is not retried; a success still
-- counts); an ended one not at all. The scheduled rows are taken first, then
-- the ready ones in a statement of their own: a promotion in flight is
-- waited for, and the task it put in line is then taken from there. Returns
-- each known id with 'cancelled', 'cancelling' (running) or its end state.
CREATE FUNCTION rota.cancel(p_ids uuid[], p_actor text)
RETURNS TABLE (id uuid, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now uuid[];
BEGIN
    WITH unscheduled AS (
        DELETE FROM rota.scheduled s WHERE s.task_id = ANY (p_ids) RETURNING s.task_id
    )
    SELECT coalesce(array_agg(task_id), '{}') INTO v_now FROM unscheduled;
    WITH unready AS (
        DELETE FROM rota.ready r WHERE r.task_id = ANY (p_ids) RETURNING r.task_id
    ), unparked AS (
        -- Their keys' parked counts are put right by rota.unpark.
        DELETE FROM rota.parked p WHERE p.task_id = ANY (p_ids) RETURNING p.task_id
    )
    SELECT v_now || coalesce(array_agg(task_id), '{}') INTO v_now
    FROM (SELECT task_id FROM unready UNION ALL SELECT task_id FROM unparked) u;
    -- Joins waiting for their members (scheduled, with no schedule yet).
    v_now := v_now || ARRAY(
        SELECT t.id FROM rota.tasks t JOIN rota.joins j ON j.task_id = t.id
        WHERE t.id = ANY (p_ids) AND t.status = 'scheduled' AND NOT t.id = ANY (v_now));
    UPDATE rota.tasks t
    SET status = 'cancelled', cancel_requested = true, finished_at = now(),
        last_error = 'cancelled by ' || p_actor
    WHERE t.id = ANY (v_now);
    -- Claimed: it ends with its attempt, and the worker holding it is told
    -- (rota_cancel: "worker task"), to stop it now.
    UPDATE rota.tasks t SET cancel_requested = true
    WHERE t.id = ANY (p_ids) AND t.status = 'pending' AND NOT t.id = ANY (v_now);
    PERFORM pg_notify('rota_cancel', r.worker || ' ' || r.task_id::text)
    FROM rota.running r WHERE r.task_id = ANY (p_ids);
    -- Their results' waiters learn it at once.
    PERFORM pg_notify('rota_results', c::text) FROM unnest(v_now) AS c;
    RETURN QUERY
    WITH outcomes AS (
        SELECT t.id,
               CASE WHEN t.id = ANY (v_now) THEN 'cancelled'
                    WHEN t.status = 'pending' THEN 'cancelling'
                    ELSE t.status::text END AS outcome
        FROM rota.tasks t WHERE t.id = ANY (p_ids)
        UNION ALL
        SELECT f.task_id, 'succeeded' FROM rota.finished f WHERE f.task_id = ANY (p_ids)
    ), logged AS (
        INSERT INTO rota.audit (actor, action, target, detail, count)
        SELECT p_actor, 'cancel', 'task', jsonb_build_object('ids', to_jsonb(p_ids)),
               count(*) FILTER (WHERE o.outcome IN ('cancelled', 'cancelling'))
        FROM outcomes o
    )
    SELECT o.id, o.outcome FROM outcomes o;
END
$$;

-- Runs dead or cancelled tasks again: same ids, a fresh attempt budget, a
-- fair place in line as soon as maintenance promotes them (within a second).
-- Returns the ids retried.
CREATE FUNCTION rota.retry(p_ids uuid[], p_actor text, p_target text DEFAULT 'task')
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[];
BEGIN
    WITH revived AS (
        UPDATE rota.tasks t
        SET status = 'scheduled', attempts = 0, cancel_requested = false, finished_at = NULL,
            unknown_since = NULL
        WHERE t.id = ANY (p_ids) AND t.status IN ('dead', 'cancelled')
        RETURNING t.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO v_ids FROM revived;
    -- A join whose members have not all succeeded waits for them again.
    INSERT INTO rota.scheduled (run_at, task_id) SELECT now(), x FROM unnest(v_ids) x
    WHERE NOT EXISTS (SELECT FROM rota.joins j WHERE j.task_id = x AND NOT j.released);
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'retry', p_target, jsonb_build_object('ids', to_jsonb(v_ids)),
            cardinality(v_ids));
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

-- Pauses or resumes a queue; false if there is no such queue.
CREATE FUNCTION rota.pause_queue(p_name text, p_paused boolean, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.queues SET paused = p_paused WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_paused THEN 'pause' ELSE 'resume' END, 'queue:' || p_name, 1);
    IF NOT p_paused THEN
        PERFORM pg_notify('rota_ready', p_name);
    END IF;
    RETURN true;
END
$$;

-- Pauses or resumes a tenant in every queue; false if there is no such tenant.
CREATE FUNCTION rota.pause_tenant(p_name text, p_paused boolean, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.tenants SET paused = p_paused WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_paused THEN 'pause' ELSE 'resume' END, 'tenant:' || p_name, 1);
    IF NOT p_paused THEN
        PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q;
    END IF;
    RETURN true;
END
$$;

-- Creates a tenant or changes the settings named in p_changes (weight,
-- concurrency_limit, rate_limit, rate_burst, capacity; a JSON null clears a
-- limit), keeping the others. Returns its slot.
CREATE FUNCTION rota.patch_tenant(p_name text, p_changes jsonb, p_actor text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v rota.tenants;
    v_id integer;
BEGIN
    INSERT INTO rota.tenants (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO v FROM rota.tenants WHERE name = p_name FOR UPDATE;
    v_id := rota.configure_tenant(
        p_name,
        CASE WHEN p_changes ? 'weight' THEN (p_changes ->> 'weight')::float8 ELSE v.weight END,
        CASE WHEN p_changes ? 'concurrency_limit' THEN (p_changes ->> 'concurrency_limit')::integer
             ELSE v.concurrency_limit END,
        CASE WHEN p_changes ? 'rate_limit' THEN (p_changes ->> 'rate_limit')::float8
             ELSE v.rate_limit END,
        CASE WHEN p_changes ? 'rate_burst' THEN (p_changes ->> 'rate_burst')::float8
             WHEN p_changes ? 'rate_limit' THEN NULL
             ELSE v.rate_burst END,
        CASE WHEN p_changes ? 'capacity' THEN (p_changes ->> 'capacity')::bigint
             ELSE v.capacity END);
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'configure', 'tenant:' || p_name, p_changes, 1);
    RETURN v_id;
END
$$;

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

-- Counts what finished since the last count, up to a second ago (a
-- completion's row carries its transaction's start time, and commits
-- shortly after); keeps a day. Returns the completions counted.
CREATE FUNCTION rota.count_service() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_from timestamptz;
    v_to timestamptz := now() - interval '1 second';
    v_counted bigint;
BEGIN
    SELECT up_to INTO v_from FROM rota.service_counted FOR UPDATE;
    IF v_from IS NULL THEN
        v_from := v_to - interval '1 hour';
        INSERT INTO rota.service_counted (up_to) VALUES (v_from);
    END IF;
    IF v_to <= v_from THEN
        RETURN 0;
    END IF;
    WITH counts AS MATERIALIZED (
        SELECT date_trunc('minute', f.finished_at) AS minute, f.queue_id, f.tenant_id,
               count(*) AS completed,
               sum(greatest(0, extract(epoch FROM f.started_at - f.enqueued_at))) AS waits
        FROM rota.finished f
        WHERE f.finished_at > v_from AND f.finished_at <= v_to
        GROUP BY 1, 2, 3
    ), saved AS (
        INSERT INTO rota.service AS s (minute, queue_id, tenant_id, completed, wait_seconds)
        SELECT minute, queue_id, tenant_id, completed, waits FROM counts
        ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE
        SET completed = s.completed + excluded.completed,
            wait_seconds = s.wait_seconds + excluded.wait_seconds
    )
    SELECT coalesce(sum(completed), 0) INTO v_counted FROM counts;
    UPDATE rota.service_counted SET up_to = v_to;
    DELETE FROM rota.service WHERE minute < now() - interval '1 day';
    RETURN v_counted;
END
$$;

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

-- Recounts rota.stats from the queue tables, and writes this minute's
-- history; returns the rows written to rota.stats.
-- Each queue's max-min fair level in a minute, into its history row: with
-- the minute's completions shared by water-filling over the tenants'
-- weights and demands (their completions in the minute and their
-- unfinished tasks as rota.stats counts them), a tenant is owed
-- least(demand, weight * level); infinity when every demand was met.
-- Tenants in ascending order of demand / weight: the largest prefix that the
-- completions satisfy whole leaves the rest to share by weight.
CREATE FUNCTION rota.fair_levels(p_minute timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH d AS (
        SELECT queue_id, coalesce(v.completed, 0)::float8 AS completed,
               (coalesce(v.completed, 0) + coalesce(s.waiting + s.running, 0))::float8 AS demand,
               t.weight
        FROM (SELECT queue_id, tenant_id, completed FROM rota.service
              WHERE minute = p_minute) v
        FULL JOIN (SELECT queue_id, tenant_id, waiting, running FROM rota.stats
                   WHERE waiting + running > 0) s USING (queue_id, tenant_id)
        JOIN rota.tenants t ON t.id = tenant_id
    ), totals AS (
        SELECT queue_id, sum(completed) AS served, sum(demand) AS asked, sum(weight) AS w_all
        FROM d GROUP BY 1
    ), ranked AS (
        SELECT queue_id, demand / weight AS r,
               sum(demand) OVER upto AS d_upto, sum(weight) OVER upto AS w_upto
        FROM d
        WINDOW upto AS (PARTITION BY queue_id ORDER BY demand / weight ROWS UNBOUNDED PRECEDING)
    ), levels AS (
        SELECT x.queue_id,
               CASE WHEN x.asked <= x.served THEN 'Infinity'::float8
                    ELSE coalesce((max(ARRAY[k.w_upto, (x.served - k.d_upto) / (x.w_all - k.w_upto)])
                                   FILTER (WHERE k.w_upto < x.w_all
                                             AND k.d_upto + k.r * (x.w_all - k.w_upto) <= x.served))[2],
                                  x.served / x.w_all)
               END AS level
        FROM totals x JOIN ranked k ON k.queue_id = x.queue_id
        GROUP BY x.queue_id, x.asked, x.served, x.w_all
    )
    UPDATE rota.queue_history h SET fair_level = l.level
    FROM levels l WHERE h.minute = p_minute AND h.queue_id = l.queue_id;
END
$$;

CREATE FUNCTION rota.refresh_stats() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
    v_minute timestamptz := date_trunc('minute', now());
BEGIN
    -- One refresh at a time; a second caller leaves it to the first.
    IF NOT pg_try_advisory_xact_lock(hashtext('rota.refresh_stats')) THEN
        RETURN 0;
    END IF;
    -- The first refresh of a minute: the last minute's fair levels again,
    -- with its completions counted since its last refresh and the counts
    -- as they stood at its end (rota.stats, not yet recounted).
    IF (SELECT c.at FROM rota.stats_counted c) < v_minute THEN
        PERFORM rota.fair_levels(v_minute - interval '1 minute');
    END IF;
    -- Only what changed is written: rows of pairs with nothing left go,
    -- rows whose counts changed are updated, new pairs are inserted. A pair's
    -- unfinished tasks (in line or claimed) enter the history (rota.service)
    -- when they change, and hourly while they stay: readers carry the last
    -- record forward.
    WITH counts (queue_id, tenant_id, waiting, running, scheduled, dead, first_vtime) AS (
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, min(vtime)
        FROM rota.ready GROUP BY 1, 2
        UNION ALL
        -- Parked (waiting for their key's room): waiting, not first in line.
        SELECT queue_id, tenant_id, count(*), 0, 0, 0, NULL
        FROM rota.parked GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, count(*), 0, 0, NULL FROM rota.running GROUP BY 1, 2
        UNION ALL
        SELECT t.queue_id, t.tenant_id, 0, 0, count(*), 0, NULL
        FROM rota.scheduled s JOIN rota.tasks t ON t.id = s.task_id GROUP BY 1, 2
        UNION ALL
        SELECT queue_id, tenant_id, 0, 0, 0, count(*), NULL
        FROM rota.tasks WHERE status = 'dead' GROUP BY 1, 2
    ), grouped AS (
        SELECT queue_id, tenant_id, sum(waiting) AS waiting, sum(running) AS running,
               sum(scheduled) AS scheduled, sum(dead) AS dead, min(first_vtime) AS first_vtime
        FROM counts GROUP BY 1, 2
    ), diff AS MATERIALIZED (
        -- A full join is a hash or merge join: linear, whatever the
        -- estimates of a table that was empty when last analyzed.
        SELECT coalesce(g.queue_id, s.queue_id) AS queue_id,
               coalesce(g.tenant_id, s.tenant_id) AS tenant_id, s.ctid AS row_at,
               g.waiting, g.running, g.scheduled, g.dead, g.first_vtime,
               -- Within a tenant and queue, line order is arrival order: its
               -- first task in line is its oldest waiting (an index probe),
               -- the same task while its place and the count in line stay.
               CASE WHEN g.first_vtime = s.first_vtime AND g.waiting = s.waiting
                    THEN s.oldest_enqueued_at
                    ELSE (SELECT t.enqueued_at
                          FROM rota.ready r JOIN rota.tasks t ON t.id = r.task_id
                          WHERE r.queue_id = g.queue_id AND r.vtime = g.first_vtime
                            AND r.tenant_id = g.tenant_id
                          ORDER BY r.seq LIMIT 1)
               END AS oldest_enqueued_at,
               g.queue_id IS NULL AS gone, s.queue_id IS NULL AS added,
               g.queue_id IS NOT NULL AND s.queue_id IS NOT NULL
                   AND ((g.waiting, g.running, g.scheduled, g.dead, g.first_vtime)
                            IS DISTINCT FROM
                        (s.waiting, s.running, s.scheduled, s.dead, s.first_vtime))
                   AS changed,
               coalesce(g.waiting + g.running, 0) AS pending,
               CASE WHEN s.queue_id IS NULL THEN coalesce(g.waiting + g.running, 0) > 0
                    WHEN g.queue_id IS NULL THEN s.waiting + s.running > 0
                    ELSE g.waiting + g.running <> s.waiting + s.running
                         OR s.recorded_at < now() - interval '1 hour'
                         OR (s.recorded_at IS NULL AND g.waiting + g.running > 0)
               END AS record,
               s.recorded_at
        FROM grouped g FULL JOIN rota.stats s
            ON s.queue_id = g.queue_id AND s.tenant_id = g.tenant_id
    ), gone AS (
        DELETE FROM rota.stats WHERE ctid = ANY (ARRAY(SELECT row_at FROM diff WHERE gone))
    ), changed AS (
        UPDATE rota.stats s
        SET waiting = d.waiting, running = d.running, scheduled = d.scheduled, dead = d.dead,
            first_vtime = d.first_vtime, oldest_enqueued_at = d.oldest_enqueued_at,
            recorded_at = CASE WHEN d.record THEN now() ELSE d.recorded_at END
        FROM diff d
        WHERE s.ctid = d.row_at AND (d.changed OR d.record) AND NOT d.gone
    ), added AS (
        INSERT INTO rota.stats (queue_id, tenant_id, waiting, running, scheduled, dead,
                                oldest_enqueued_at, recorded_at, first_vtime)
        SELECT queue_id, tenant_id, waiting, running, scheduled, dead, oldest_enqueued_at,
               CASE WHEN record THEN now() END, first_vtime
        FROM diff WHERE added
    ), recorded AS (
        INSERT INTO rota.service AS v (minute, queue_id, tenant_id, completed, wait_seconds,
                                       pending)
        SELECT v_minute, queue_id, tenant_id, 0, 0, pending FROM diff WHERE record
        ON CONFLICT (minute, queue_id, tenant_id) DO UPDATE SET pending = excluded.pending
    )
    SELECT count(*) INTO v_rows FROM grouped;
    INSERT INTO rota.stats_counted AS c (at) VALUES (now())
    ON CONFLICT (only_row) DO UPDATE SET at = excluded.at;
    -- The charts' history: this minute's row holds each gauge's last count
    -- in the minute and its largest; completions and deaths of this minute
    -- and the last are recounted (late commits land), the deaths by the
    -- partial index of dead tasks.
    INSERT INTO rota.queue_history AS h (minute, queue_id, waiting, running,
                                         oldest_wait_seconds, waiting_max, running_max,
                                         oldest_wait_max)
    SELECT v_minute, q.id, coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest), coalesce(s.waiting, 0), coalesce(s.running, 0),
           extract(epoch FROM now() - s.oldest)
    FROM rota.queues q
    LEFT JOIN (SELECT queue_id, sum(waiting) AS waiting, sum(running) AS running,
                      min(oldest_enqueued_at) AS oldest
               FROM rota.stats GROUP BY queue_id) s ON s.queue_id = q.id
    ON CONFLICT (minute, queue_id) DO UPDATE
    SET waiting = excluded.waiting, running = excluded.running,
        oldest_wait_seconds = excluded.oldest_wait_seconds,
        waiting_max = greatest(h.waiting_max, excluded.waiting_max),
        running_max = greatest(h.running_max, excluded.running_max),
        oldest_wait_max = greatest(h.oldest_wait_max, excluded.oldest_wait_max);
    UPDATE rota.queue_history h
    SET completed = coalesce(v.completed, 0), died = coalesce(d.died, 0)
    FROM rota.queue_history x
    LEFT JOIN (SELECT minute, queue_id, sum(completed) AS completed FROM rota.service
               WHERE minute >= v_minute - interval '1 minute' GROUP BY 1, 2) v
        ON v.minute = x.minute AND v.queue_id = x.queue_id
    LEFT JOIN (SELECT date_trunc('minute', finished_at) AS minute, queue_id, count(*) AS died
               FROM rota.tasks
               WHERE status = 'dead' AND finished_at >= v_minute - interval '1 minute'
               GROUP BY 1, 2) d
        ON d.minute = x.minute AND d.queue_id = x.queue_id
    WHERE x.minute >= v_minute - interval '1 minute'
      AND h.minute = x.minute AND h.queue_id = x.queue_id;
    -- This minute's fair levels, from the counts now; a minute keeps those
    -- of its last refresh, and its first refresh of the next minute
    -- recomputed them (above) with the completions counted since.
    PERFORM rota.fair_levels(v_minute);
    DELETE FROM rota.queue_history WHERE minute < now() - interval '1 day';
    RETURN v_rows;
END
$$;

-- Some tenants' service per minute and queue in [p_since, p_until): the
-- completions and their summed waits, the demand (completions and the
-- unfinished tasks last recorded at or before the minute, carried forward
-- over minutes without a record), and the max-min fair share,
-- least(demand, weight now * the queue's fair level), NULL where no level
-- was kept. Every minute of a (tenant, queue) with a record in the window
-- or in the two hours before it (records come at least hourly).
CREATE FUNCTION rota.tenant_minutes(p_tenants integer[], p_since timestamptz,
                                    p_until timestamptz)
RETURNS TABLE (minute timestamptz, tenant_id integer, queue_id integer, completed bigint,
               wait_seconds double precision, demand bigint, fair_share double precision)
LANGUAGE sql STABLE AS $$
    WITH kept AS (
        SELECT v.minute, v.tenant_id, v.queue_id, v.completed, v.wait_seconds, v.pending
        FROM rota.service v
        WHERE v.tenant_id = ANY (p_tenants)
          AND v.minute >= date_trunc('minute', p_since) - interval '2 hours'
          AND v.minute < p_until
    ), grid AS (
        SELECT m.minute, p.tenant_id, p.queue_id
        FROM (SELECT DISTINCT k.tenant_id, k.queue_id FROM kept k) p
        CROSS JOIN generate_series(date_trunc('minute', p_since) - interval '2 hours',
                                   p_until, interval '1 minute') m (minute)
        WHERE m.minute < p_until
    ), filled AS (
        SELECT g.minute, g.tenant_id, g.queue_id, coalesce(k.completed, 0) AS completed,
               coalesce(k.wait_seconds, 0) AS wait_seconds, k.pending,
               count(k.pending) OVER (PARTITION BY g.tenant_id, g.queue_id
                                      ORDER BY g.minute) AS records
        FROM grid g
        LEFT JOIN kept k
            ON k.minute = g.minute AND k.tenant_id = g.tenant_id AND k.queue_id = g.queue_id
    ), carried AS (
        SELECT f.minute, f.tenant_id, f.queue_id, f.completed, f.wait_seconds,
               f.completed + coalesce(max(f.pending) OVER (PARTITION BY f.tenant_id, f.queue_id,
                                                                        f.records), 0) AS demand
        FROM filled f
    )
    SELECT c.minute, c.tenant_id, c.queue_id, c.completed::bigint, c.wait_seconds, c.demand,
           CASE WHEN h.fair_level IS NOT NULL THEN least(c.demand, t.weight * h.fair_level) END
    FROM carried c
    JOIN rota.tenants t ON t.id = c.tenant_id
    LEFT JOIN rota.queue_history h ON h.minute = c.minute AND h.queue_id = c.queue_id
    WHERE c.minute >= p_since
$$;

-- Makes tasks just promoted (or the rest of a load that met a task already
-- run, rota.tasks_enter_line) claimable at their fair places
-- (start-time fair queueing, docs/architecture.md): each (queue, tenant)
-- pair's tasks, in arrival (seq) order, start at S = max(V, F), the queue's
-- virtual clock or the tenant's finish tag, and move F on by cost / weight.
-- Saves each pair's finish tag and largest start tag, and
-- notifies each queue once. Called only by rota's definer functions: the tags
-- come from these rules, never from a caller. Loads are placed by the same
-- statement in rota.tasks_enter_line, from the insert's transition table.
CREATE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                p_tenant_ids integer[], p_costs double precision[],
                                p_priorities smallint[])
RETURNS void
-- Custom plans for large promotions: the arrays' sizes decide the joins (a
-- generic plan, which rota's sessions otherwise force, guesses them). Up to
-- 512 tasks the generic plans are as fast, and planning would cost a
-- one-task promotion more than running its statements does.
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_ids) <= 512 THEN
        -- Until the function returns (its SET clause restores the setting).
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT q, t FROM unnest(p_queue_ids, p_tenant_ids) AS x(q, t)) pairs;
    -- The pairs' tags stay locked until the transaction ends.
    PERFORM rota.lock_tags(v_pair_queues, v_pair_tenants);
    WITH starts AS MATERIALIZED (
        SELECT * FROM rota.fair_starts(v_pair_queues, v_pair_tenants)
    ), placed AS MATERIALIZED (
        SELECT x.queue_id, x.tenant_id, x.seq, x.id, x.priority,
               s.start + sum(x.cost / s.weight) OVER w - x.cost / s.weight AS vtime,
               s.start + sum(x.cost / s.weight) OVER w AS finish
        FROM unnest(p_ids, p_seqs, p_queue_ids, p_tenant_ids, p_costs, p_priorities)
             AS x(id, seq, queue_id, tenant_id, cost, priority)
        JOIN starts s ON s.queue_id = x.queue_id AND s.tenant_id = x.tenant_id
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq
                     ROWS UNBOUNDED PRECEDING)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT queue_id, vtime, tenant_id, seq, id, priority FROM placed
    )
    UPDATE rota.tenant_queues tq SET finish_tag = m.finish, last_start = m.start
    FROM (SELECT queue_id, tenant_id, max(finish) AS finish, max(vtime) AS start
          FROM placed GROUP BY 1, 2) m
    WHERE tq.queue_id = m.queue_id AND tq.tenant_id = m.tenant_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(p_queue_ids)));
END
$$;

-- Moves due scheduled tasks (ETA reached, retry backoff over) into line, in
-- one transaction with their removal from the schedule.
CREATE FUNCTION rota.promote_due(p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids uuid[];
    v_seqs bigint[];
    v_queues integer[];
    v_tenants integer[];
    v_costs double precision[];
    v_priorities smallint[];
BEGIN
    SELECT array_agg(d.id ORDER BY d.seq), array_agg(d.seq ORDER BY d.seq),
           array_agg(d.queue_id ORDER BY d.seq), array_agg(d.tenant_id ORDER BY d.seq),
           array_agg(d.cost ORDER BY d.seq), array_agg(d.priority ORDER BY d.seq)
    INTO v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities
    FROM rota.take_due(least(greatest(p_limit, 1), 100000)) d;
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities);
    RETURN coalesce(cardinality(v_ids), 0);
END
$$;

-- Checks a worker's secret, and makes the rest of the transaction act as that
-- worker: rota.take_running and rota.extend_leases then touch only its tasks.
CREATE FUNCTION rota.check_worker(p_worker text, p_secret bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_secret IS NULL OR NOT EXISTS (
        SELECT FROM rota.workers w WHERE w.id = p_worker AND w.secret_hash = sha256(p_secret)
    ) THEN
        RAISE EXCEPTION 'worker % is not registered with this secret', p_worker
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('rota.acting_worker', p_worker, true);
END
$$;

-- What a worker role calls: each checks the worker's secret first.
-- Registers a worker: its secret's hash, and how often it beats (it may be
-- declared dead only after two beats of silence).
CREATE FUNCTION rota.register_worker(p_id text, p_host text, p_pid integer, p_queues text[],
                                     p_concurrency integer, p_secret bytea,
                                     p_heartbeat_seconds double precision) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO rota.workers (id, host, pid, queues, concurrency, secret_hash, heartbeat_seconds)
    VALUES (p_id, p_host, p_pid, p_queues, p_concurrency, sha256(p_secret),
            least(greatest(p_heartbeat_seconds, 0), 3600))
$$;

CREATE FUNCTION rota.worker_claim(p_worker text, p_secret bytea, p_queues text[],
                                  p_limit integer, p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds);
END
$$;

CREATE FUNCTION rota.worker_complete(p_worker text, p_secret bytea, p_ids uuid[],
                                     p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete(p_ids, p_attempts);
END
$$;

CREATE FUNCTION rota.worker_complete_claim(p_worker text, p_secret bytea, p_ids uuid[],
                                           p_attempts integer[], p_queues text[],
                                           p_limit integer, p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete_claim(p_ids, p_attempts, p_queues, p_limit,
                                                   p_worker, p_lease_seconds);
END
$$;

CREATE FUNCTION rota.worker_fail(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_errors text[],
    p_retry_at timestamptz[], p_final boolean[], p_tracebacks text[]
) RETURNS TABLE (id uuid, status rota.task_status, run_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.fail(p_ids, p_attempts, p_errors, p_retry_at, p_final,
                                         p_tracebacks);
END
$$;

-- Hands back unstarted tasks (no attempt used).
CREATE FUNCTION rota.worker_release(p_worker text, p_secret bytea, p_ids uuid[],
                                    p_attempts integer[]) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.requeue(p_ids, p_attempts, false, NULL);
END
$$;

CREATE FUNCTION rota.worker_defer_unknown(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_delay double precision,
    p_grace double precision, p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.defer_unknown(p_ids, p_attempts, p_delay, p_grace, p_reason);
END
$$;

CREATE FUNCTION rota.worker_extend_leases(p_worker text, p_secret bytea, p_ids uuid[],
                                          p_attempts integer[], p_lease_seconds double precision)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.extend_leases(p_ids, p_attempts, p_lease_seconds);
END
$$;

-- The tasks a worker holds (to find what a claim it could not read took).
CREATE FUNCTION rota.worker_claims(p_worker text, p_secret bytea)
RETURNS TABLE (task_id uuid, attempt integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT r.task_id, r.attempt FROM rota.running r WHERE r.worker = p_worker;
END
$$;

-- A worker's heartbeat: false once it was declared dead (it must stop).
CREATE FUNCTION rota.worker_beat(p_worker text, p_secret bytea) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET heartbeat_at = now() WHERE id = p_worker AND stopped_at IS NULL;
    RETURN FOUND;
END
$$;

-- A worker declared dead while it was only cut off (a partition longer than
-- ROTA_WORKER_DEAD_AFTER_SECONDS) comes back under its own name: what it held
-- went back in line when it was declared dead, and its reports of those
-- tasks are refused (their leases passed). False when its row is gone.
CREATE FUNCTION rota.worker_rejoin(p_worker text, p_secret bytea) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET stopped_at = NULL, heartbeat_at = now() WHERE id = p_worker;
    RETURN FOUND;
END
$$;

CREATE FUNCTION rota.worker_stop(p_worker text, p_secret bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    UPDATE rota.workers SET stopped_at = now() WHERE id = p_worker;
END
$$;


-- Requeues claims still held by workers stopped more than p_after ago (the
-- attempt counts); returns the ids requeued.
CREATE FUNCTION rota.reap_stopped_claims(p_after interval) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tasks uuid[];
BEGIN
    SELECT array_agg(r.task_id) INTO v_tasks
    FROM rota.running r JOIN rota.workers w ON w.id = r.worker
    WHERE w.stopped_at < now() - greatest(p_after, interval '1 second');
    IF v_tasks IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM rota.requeue(
        v_tasks, array_fill(NULL::integer, ARRAY[cardinality(v_tasks)]), true,
        'its worker stopped holding it');
END
$$;

-- Puts the tasks an INSERT or COPY into rota.tasks stored in line, or on the
-- schedule when their ETA is later: the places and tags computed here by
-- rota.enter_line's rules, never by the caller. A row is inserted once, so it is
-- put in line once: a second place in line for a task would make every claim
-- that meets it roll back. Only tasks on their first attempt qualify. The
-- statement's new rows come from its transition table: nothing is read back.
CREATE FUNCTION rota.tasks_enter_line() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
    v_ran uuid[];
BEGIN
    -- The keys their limits count (only while some limit exists).
    IF EXISTS (SELECT FROM rota.key_limits) THEN
        PERFORM rota.make_keys(ARRAY(SELECT DISTINCT f.limit_key FROM loaded f
                                     WHERE f.limit_key IS NOT NULL),
                               ARRAY(SELECT DISTINCT f.queue_id FROM loaded f
                                     WHERE f.limit_key IS NOT NULL));
    END IF;
    -- A batch loaded again brings back no task that has run. The load looked
    -- before inserting (which keeps its count right); a task that finished
    -- meanwhile, while the insert waited on its row's deletion, is seen here.
    v_ran := ARRAY(SELECT f.task_id FROM rota.finished f
                   WHERE f.task_id = ANY (ARRAY(SELECT l.id FROM loaded l)));
    IF v_ran <> '{}' THEN
        -- Rare: those rows go, and the rest go in line through
        -- rota.enter_line, which leaves the statements below (and their
        -- cached plans) as every other load runs them.
        DELETE FROM rota.tasks WHERE id = ANY (v_ran);
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT coalesce(f.eta, now()), f.id FROM loaded f
        WHERE f.attempts = 0 AND f.status = 'scheduled' AND f.id <> ALL (v_ran);
        PERFORM rota.enter_line(array_agg(f.id ORDER BY f.seq), array_agg(f.seq ORDER BY f.seq),
                                array_agg(f.queue_id ORDER BY f.seq),
                                array_agg(f.tenant_id ORDER BY f.seq),
                                array_agg(f.cost ORDER BY f.seq),
                                array_agg(f.priority ORDER BY f.seq))
        FROM loaded f
        WHERE f.attempts = 0 AND f.status = 'pending' AND f.id <> ALL (v_ran);
        RETURN NULL;
    END IF;
    INSERT INTO rota.scheduled (run_at, task_id)
    SELECT coalesce(f.eta, now()), f.id FROM loaded f
    WHERE f.attempts = 0 AND f.status = 'scheduled';
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT f.queue_id AS q, f.tenant_id AS t FROM loaded f
          WHERE f.attempts = 0 AND f.status = 'pending') pairs;
    IF v_pair_queues IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM rota.lock_tags(v_pair_queues, v_pair_tenants);
    -- rota.enter_line's placement, reading the new rows where they are:
    -- passing them to it as arrays cost a bulk load 1.2 us a task.
    WITH starts AS MATERIALIZED (
        SELECT * FROM rota.fair_starts(v_pair_queues, v_pair_tenants)
    ), placed AS MATERIALIZED (
        SELECT x.queue_id, x.tenant_id, x.seq, x.id, x.priority,
               s.start + sum(x.cost / s.weight) OVER w - x.cost / s.weight AS vtime,
               s.start + sum(x.cost / s.weight) OVER w AS finish
        FROM loaded x
        JOIN starts s ON s.queue_id = x.queue_id AND s.tenant_id = x.tenant_id
        WHERE x.attempts = 0 AND x.status = 'pending'
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq
                     ROWS UNBOUNDED PRECEDING)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT queue_id, vtime, tenant_id, seq, id, priority FROM placed
    )
    UPDATE rota.tenant_queues tq SET finish_tag = m.finish, last_start = m.start
    FROM (SELECT queue_id, tenant_id, max(finish) AS finish, max(vtime) AS start
          FROM placed GROUP BY 1, 2) m
    WHERE tq.queue_id = m.queue_id AND tq.tenant_id = m.tenant_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(v_pair_queues)));
    RETURN NULL;
END
$$;

CREATE TRIGGER enter_line AFTER INSERT ON rota.tasks
    REFERENCING NEW TABLE AS loaded
    FOR EACH STATEMENT EXECUTE FUNCTION rota.tasks_enter_line();

-- Loaders of rota before migration 0028 call this after their COPY; the
-- insert trigger (rota.tasks_enter_line) has put those tasks in line already.
CREATE FUNCTION rota.enter_line_of(p_ids uuid[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ SELECT $$;

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

-- Completes claimed tasks, as rota.complete_counted, and keeps the results
-- of those completed (p_values[i] or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none), waking their waiters. Returns
-- every task completed, and whether its tenant's count was kept.
CREATE FUNCTION rota.complete_keeping(p_ids uuid[], p_attempts integer[], p_values jsonb[],
                                      p_refused text[], p_ttls double precision[])
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT c.task_id, c.counted FROM rota.complete_counted(p_ids, p_attempts) c
    ), kept AS (
        INSERT INTO rota.results (task_id, value, refused, expires_at)
        SELECT k.id, k.value, k.refused, now() + make_interval(secs => k.ttl)
        FROM unnest(p_ids, p_values, p_refused, p_ttls) AS k (id, value, refused, ttl)
        JOIN done d ON d.task_id = k.id
        WHERE k.ttl IS NOT NULL
        ON CONFLICT (task_id) DO NOTHING
        RETURNING task_id
    )
    -- One notification per 200 results, their ids comma-separated (under the
    -- 8000-byte payload cap): a waiter looks for its own id in it.
    SELECT d.task_id, d.counted
    FROM done d, (
        SELECT count(pg_notify('rota_results', c.ids))
        FROM (
            SELECT string_agg(n.task_id::text, ',') AS ids
            FROM (SELECT k.task_id, (row_number() OVER ()) / 200 AS chunk FROM kept k) n
            GROUP BY n.chunk
        ) c
    ) woken;
END
$$;

CREATE FUNCTION rota.worker_complete_keeping(p_worker text, p_secret bytea, p_ids uuid[],
                                             p_attempts integer[], p_values jsonb[],
                                             p_refused text[], p_ttls double precision[])
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT c.task_id FROM rota.complete_keeping(p_ids, p_attempts, p_values,
                                                             p_refused, p_ttls) c;
END
$$;

-- Wakes the waiters of tasks that ended without a result (dead, cancelled).
CREATE FUNCTION rota.wake_result_waiters(p_ids uuid[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_notify('rota_results', id::text) FROM unnest(p_ids) AS id;
$$;

-- What became of a task, for its result's waiter: its state, and the result
-- (or the refusal) once it succeeded, or the error and traceback it died of.
-- `kept`: a result row was found; past `expires_at` its value is gone.
CREATE FUNCTION rota.task_result(p_id uuid)
RETURNS TABLE (status text, value jsonb, refused text, kept boolean, error text,
               traceback text, finished_at timestamptz, expires_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM rota.running r WHERE r.task_id = t.id)
                THEN 'running' ELSE t.status::text END,
           NULL::jsonb, NULL::text, false, t.last_error, t.traceback, t.finished_at,
           NULL::timestamptz
    FROM rota.tasks t WHERE t.id = p_id
    UNION ALL
    SELECT 'succeeded', CASE WHEN r.expires_at > now() THEN r.value END,
           CASE WHEN r.expires_at > now() THEN r.refused END, r.task_id IS NOT NULL, NULL,
           NULL, f.finished_at, r.expires_at
    FROM rota.finished f
    LEFT JOIN rota.results r ON r.task_id = f.task_id
    WHERE f.task_id = p_id
$$;

-- Up to p_limit results past their time lose their value (their row stays,
-- to say "expired", while their task's record lasts); up to p_limit expired
-- ones whose task's record is gone go. Returns the rows changed.
CREATE FUNCTION rota.prune_results(p_limit integer) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH expired AS (
        UPDATE rota.results SET value = NULL, refused = NULL
        WHERE task_id = ANY (ARRAY(
            SELECT r.task_id FROM rota.results r
            WHERE r.expires_at <= now() AND r.value IS NOT NULL LIMIT p_limit))
        RETURNING 1
    ), forgotten AS (
        DELETE FROM rota.results WHERE task_id = ANY (ARRAY(
            SELECT r.task_id FROM rota.results r
            WHERE r.value IS NULL
              AND NOT EXISTS (SELECT 1 FROM rota.finished f WHERE f.task_id = r.task_id)
            LIMIT p_limit))
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM expired) + (SELECT count(*) FROM forgotten)
$$;

-- rota.complete_claim for a batch whose completions keep results: each
-- task's result (p_values[i], or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none) kept with its completion, the
-- waiters woken, then the claim, in one statement.
CREATE FUNCTION rota.complete_keeping_claim(p_ids uuid[], p_attempts integer[],
                                            p_values jsonb[], p_refused text[],
                                            p_ttls double precision[], p_queues text[],
                                            p_limit integer, p_worker text,
                                            p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_completed integer;
    v_locked boolean;
BEGIN
    SELECT count(*), coalesce(bool_or(c.counted), false) INTO v_completed, v_locked
    FROM rota.complete_keeping(p_ids, p_attempts, p_values, p_refused, p_ttls) c;
    RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz,
                        v_completed, NOT v_locked;
    IF NOT v_locked THEN
        RETURN QUERY SELECT c.*, NULL::integer, NULL::boolean
                     FROM rota.claim(p_queues, p_limit, p_worker, p_lease_seconds) c;
    END IF;
END
$$;

CREATE FUNCTION rota.worker_complete_keeping_claim(
    p_worker text, p_secret bytea, p_ids uuid[], p_attempts integer[], p_values jsonb[],
    p_refused text[], p_ttls double precision[], p_queues text[], p_limit integer,
    p_lease_seconds double precision
)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rota.check_worker(p_worker, p_secret);
    RETURN QUERY SELECT * FROM rota.complete_keeping_claim(p_ids, p_attempts, p_values,
                                                           p_refused, p_ttls, p_queues, p_limit,
                                                           p_worker, p_lease_seconds);
END
$$;


-- Counts down the joins of those of p_ids that are members; returns the
-- joins that stopped waiting. The update walks the joins in id order (the
-- plan is pinned to a nested loop over the sorted counts), so that it locks
-- them in that order, as every countdown does: completions of members of the
-- same joins cannot deadlock.
CREATE FUNCTION rota.count_down_joins(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM rota.joins WHERE NOT released) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH counted AS MATERIALIZED (
        SELECT m.join_id, count(*)::integer AS n
        FROM rota.members m WHERE m.task_id = ANY (p_ids)
        GROUP BY m.join_id ORDER BY m.join_id
    ), counted_down AS (
        UPDATE rota.joins j SET waiting = j.waiting - c.n, released = j.waiting = c.n
        FROM counted c
        WHERE j.task_id = c.join_id AND NOT j.released
        RETURNING j.task_id, j.released
    )
    SELECT d.task_id FROM counted_down d WHERE d.released;
END
$$;

-- A join's payload as it runs: its members' results (the one member's, or
-- the list in their order; null where none was kept) before its own arguments.
CREATE FUNCTION rota.joined_payload(p_join uuid) RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT (jsonb_build_object('args', jsonb_build_array(
                CASE j.results
                    WHEN 'one' THEN (SELECT r.value FROM rota.members m
                                     LEFT JOIN rota.results r ON r.task_id = m.task_id
                                     WHERE m.join_id = j.task_id)
                    ELSE (SELECT coalesce(jsonb_agg(r.value ORDER BY m.position), '[]')
                          FROM rota.members m LEFT JOIN rota.results r ON r.task_id = m.task_id
                          WHERE m.join_id = j.task_id)
                END) || (j.payload::jsonb -> 'args'))
            || (j.payload::jsonb - 'args'))::json
    FROM rota.joins j WHERE j.task_id = p_join
$$;

-- A member that dies or is cancelled makes its waiting join dead with the
-- reason (and so on up, the join being a task like any); retrying the member
-- lets the join wait again.
CREATE FUNCTION rota.member_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_join uuid;
BEGIN
    UPDATE rota.joins j SET failed_member = NEW.id
    FROM rota.members m
    WHERE m.task_id = NEW.id AND j.task_id = m.join_id AND NOT j.released
      AND j.failed_member IS NULL
    RETURNING j.task_id INTO v_join;
    IF v_join IS NOT NULL THEN
        UPDATE rota.tasks t
        SET status = 'dead', finished_at = now(),
            last_error = format('member %s %s: %s', NEW.id,
                                CASE NEW.status WHEN 'dead' THEN 'died' ELSE 'was cancelled' END,
                                coalesce(NEW.last_error, 'no error recorded'))
        WHERE t.id = v_join AND t.status = 'scheduled';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER member_ended AFTER UPDATE OF status ON rota.tasks
    FOR EACH ROW
    WHEN (NEW.status IN ('dead', 'cancelled') AND OLD.status NOT IN ('dead', 'cancelled'))
    EXECUTE FUNCTION rota.member_ended();

CREATE FUNCTION rota.member_revived() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_join uuid;
BEGIN
    UPDATE rota.joins j SET failed_member = NULL
    FROM rota.members m
    WHERE m.task_id = NEW.id AND j.task_id = m.join_id AND j.failed_member = NEW.id
    RETURNING j.task_id INTO v_join;
    IF v_join IS NOT NULL THEN
        UPDATE rota.tasks t
        SET status = 'scheduled', finished_at = NULL,
            last_error = format('waits again: member %s was retried', NEW.id)
        WHERE t.id = v_join AND t.status = 'dead';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER member_revived AFTER UPDATE OF status ON rota.tasks
    FOR EACH ROW
    WHEN (OLD.status IN ('dead', 'cancelled') AND NEW.status NOT IN ('dead', 'cancelled'))
    EXECUTE FUNCTION rota.member_revived();

-- Stores a workflow's joins and members (rota.workflow), in the transaction
-- that loaded its new tasks: the joins were loaded scheduled at p_waiting_at,
-- and are taken off the schedule here to wait. A member stored before
-- (rota.workflow.after) must be known, of p_tenant, neither dead nor
-- cancelled, and in no other join; one that succeeded counts as done.
-- Refuses a bad graph with the reason (nothing of it stays).
CREATE FUNCTION rota.add_workflow(
    p_joins uuid[], p_results text[], p_payloads json[],
    p_members uuid[], p_member_joins uuid[], p_positions integer[],
    p_tenant text, p_waiting_at timestamptz
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bad record;
BEGIN
    -- Held until the transaction ends: a member cannot complete unseen.
    PERFORM FROM rota.tasks t WHERE t.id = ANY (p_members) ORDER BY t.id FOR SHARE;
    WITH found AS (
        SELECT x.id,
               coalesce((SELECT t.status::text FROM rota.tasks t WHERE t.id = x.id),
                        (SELECT 'succeeded' FROM rota.finished f WHERE f.task_id = x.id))
                   AS status,
               coalesce((SELECT coalesce(t.tenant, n.name) FROM rota.tasks t
                         JOIN rota.tenants n ON n.id = t.tenant_id WHERE t.id = x.id),
                        (SELECT n.name FROM rota.finished f
                         JOIN rota.tenants n ON n.id = f.tenant_id WHERE f.task_id = x.id))
                   AS tenant,
               (SELECT m.join_id FROM rota.members m WHERE m.task_id = x.id) AS other_join
        FROM unnest(p_members) AS x(id)
    )
    SELECT * INTO v_bad FROM found f
    WHERE f.status IS NULL OR f.status NOT IN ('pending', 'scheduled', 'succeeded')
       OR f.tenant <> p_tenant OR f.other_join IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%', CASE
            WHEN v_bad.status IS NULL THEN format('a join on an unknown task: %s', v_bad.id)
            WHEN v_bad.tenant <> p_tenant THEN format(
                'task %s is tenant %s''s: a workflow''s tasks are all one tenant''s (%s)',
                v_bad.id, v_bad.tenant, p_tenant)
            WHEN v_bad.other_join IS NOT NULL THEN format(
                'task %s is already a member of join %s: a task has one join at most',
                v_bad.id, v_bad.other_join)
            ELSE format('task %s is %s: retry it before joining it', v_bad.id, v_bad.status)
        END;
    END IF;
    DELETE FROM rota.scheduled s WHERE s.run_at = p_waiting_at AND s.task_id = ANY (p_joins);
    INSERT INTO rota.joins (task_id, members, waiting, results, payload, released)
    SELECT j.id, c.n, c.waiting, j.results, j.payload, c.waiting = 0
    FROM unnest(p_joins, p_results, p_payloads) AS j(id, results, payload)
    JOIN (SELECT m.join_id, count(*)::integer AS n,
                 count(*) FILTER (WHERE NOT EXISTS (
                     SELECT FROM rota.finished f WHERE f.task_id = m.member))::integer AS waiting
          FROM unnest(p_members, p_member_joins) AS m(member, join_id)
          GROUP BY m.join_id) c ON c.join_id = j.id;
    INSERT INTO rota.members (task_id, join_id, position)
    SELECT * FROM unnest(p_members, p_member_joins, p_positions);
    -- A join whose members had all succeeded already is due now.
    INSERT INTO rota.scheduled (run_at, task_id)
    SELECT now(), j.task_id FROM rota.joins j
    WHERE j.task_id = ANY (p_joins) AND j.released;
END
$$;

-- Records measured run times (a worker's, each heartbeat): per queue and
-- tenant, runs and their seconds. In queues charged by time they move the
-- pair's and the queue's seconds per run (a mean over about the last ten
-- runs), which the next loads' places are costed with. A pair measured for
-- the first time, or whose mean more than doubled or halved, has its waiting
-- tasks placed again at the new cost (from its first one on, in their
-- order): a backlog loaded before it was measured does not keep a wrong
-- share. Rows are locked in key order, as loads lock them.
CREATE FUNCTION rota.record_run_times(p_queues text[], p_tenants text[], p_runs integer[],
                                      p_seconds double precision[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queues integer[];
    v_tenants integer[];
    v_steps double precision[];
BEGIN
    WITH given AS MATERIALIZED (
        SELECT q.id AS queue_id, t.id AS tenant_id, t.weight, x.runs, x.seconds
        FROM unnest(p_queues, p_tenants, p_runs, p_seconds) AS x(queue, tenant, runs, seconds)
        JOIN rota.queues q ON q.name = x.queue AND q.charge_time
        JOIN rota.tenants t ON t.name = x.tenant
        WHERE x.runs > 0 AND x.seconds >= 0
    ), locked AS MATERIALIZED (
        SELECT tq.queue_id, tq.tenant_id, tq.run_seconds AS before FROM rota.tenant_queues tq
        JOIN given g ON g.queue_id = tq.queue_id AND g.tenant_id = tq.tenant_id
        ORDER BY tq.queue_id, tq.tenant_id FOR UPDATE OF tq
    ), pairs AS (
        UPDATE rota.tenant_queues tq
        SET run_seconds = CASE WHEN tq.run_seconds IS NULL THEN g.seconds / g.runs
                               ELSE tq.run_seconds
                                    + (g.seconds / g.runs - tq.run_seconds) * g.runs / (g.runs + 10.0)
                          END
        FROM given g JOIN locked l ON l.queue_id = g.queue_id AND l.tenant_id = g.tenant_id
        WHERE tq.queue_id = g.queue_id AND tq.tenant_id = g.tenant_id
        RETURNING tq.queue_id, tq.tenant_id, tq.run_seconds, l.before, g.weight
    ), queues AS (
        UPDATE rota.queues q
        SET run_seconds = CASE WHEN q.run_seconds IS NULL THEN a.seconds / a.runs
                               ELSE q.run_seconds
                                    + (a.seconds / a.runs - q.run_seconds) * a.runs / (a.runs + 10.0)
                          END
        FROM (SELECT g.queue_id, sum(g.runs) AS runs, sum(g.seconds) AS seconds
              FROM given g GROUP BY g.queue_id) a
        WHERE q.id = a.queue_id
    )
    SELECT array_agg(p.queue_id), array_agg(p.tenant_id),
           array_agg(greatest(p.run_seconds, 1e-6) / p.weight)
    INTO v_queues, v_tenants, v_steps
    FROM pairs p
    WHERE p.before IS NULL OR p.run_seconds > 2 * p.before OR p.run_seconds < p.before / 2;
    IF v_queues IS NULL THEN
        RETURN;
    END IF;
    -- Placed again one run's cost apart (a declared cost of 1 each).
    WITH moved AS (
        SELECT * FROM unnest(v_queues, v_tenants, v_steps) AS m(queue_id, tenant_id, step)
    ), ordered AS MATERIALIZED (
        SELECT r.ctid AS row_id, r.queue_id, r.tenant_id, m.step,
               first_value(r.vtime) OVER w AS first, row_number() OVER w - 1 AS n
        FROM rota.ready r JOIN moved m ON m.queue_id = r.queue_id AND m.tenant_id = r.tenant_id
        WINDOW w AS (PARTITION BY r.queue_id, r.tenant_id ORDER BY r.vtime, r.seq)
    ), placed AS (
        UPDATE rota.ready r SET vtime = o.first + o.n * o.step
        FROM ordered o WHERE r.ctid = o.row_id
        RETURNING r.queue_id, r.tenant_id, r.vtime
    )
    UPDATE rota.tenant_queues tq SET finish_tag = p.last + m.step
    FROM (SELECT queue_id, tenant_id, max(vtime) AS last FROM placed GROUP BY 1, 2) p
    JOIN moved m ON m.queue_id = p.queue_id AND m.tenant_id = p.tenant_id
    WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id;
END
$$;

-- Charges a queue's tenants by measured run time (p_charge), or by declared
-- cost alone; false if there is no such queue.
CREATE FUNCTION rota.charge_queue(p_name text, p_charge_time boolean, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.queues SET charge_time = p_charge_time WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, CASE WHEN p_charge_time THEN 'charge by time' ELSE 'charge by cost' END,
            'queue:' || p_name, 1);
    RETURN true;
END
$$;

-- Keys of limits for names of tasks just loaded into these queues (made on
-- first sight, in name order: loads making the same ones cannot deadlock),
-- and the queues marked as checking them (once: a marked queue's row is not
-- written). A name whose limit does not exist gets no row: its tasks run
-- unlimited.
CREATE FUNCTION rota.make_keys(p_names text[], p_queue_ids integer[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- A new key's bucket starts full, as a new limit's does.
    INSERT INTO rota.keys (name, limit_id, tokens)
    SELECT n, l.id, l.rate_burst
    FROM unnest(p_names) n JOIN rota.key_limits l ON l.name = split_part(n, '/', 1)
    WHERE NOT EXISTS (SELECT FROM rota.keys k WHERE k.name = n)
    ORDER BY n
    ON CONFLICT (name) DO NOTHING;
    IF EXISTS (SELECT FROM unnest(p_names) n
               JOIN rota.key_limits l ON l.name = split_part(n, '/', 1)) THEN
        UPDATE rota.queues q SET key_limited = true
        WHERE q.id = ANY (p_queue_ids) AND NOT q.key_limited;
    END IF;
END
$$;

-- A claim's admission on keys (rota.claim calls it for queues holding tasks
-- of a limit): of the keyed tasks given in line order (with their keys),
-- each whose key is limited takes a free
-- slot and a token of it, as many as the key has; the others are parked.
-- Keys are locked in id order, after the claim's tenant rows, as every
-- writer of key counters locks them; FOR UPDATE reads the latest committed
-- counters, so racing claims cannot both take a key's last slot. Then parked
-- tasks of keys with room go back in line (rota.unpark): last, as nothing
-- after it in the claim waits for a lock. Returns each keyed task's verdict
-- and, when its key counts it, the key.
CREATE FUNCTION rota.key_admit(p_ids uuid[], p_keys text[], p_queue_ids integer[],
                               p_vtimes double precision[], p_tenant_ids integer[],
                               p_seqs bigint[], p_priorities smallint[])
RETURNS TABLE (task_id uuid, key_id integer, fits boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH given AS MATERIALIZED (
        SELECT x.*, k.id AS key
        FROM unnest(p_ids, p_keys, p_queue_ids, p_vtimes, p_tenant_ids, p_seqs, p_priorities)
                 WITH ORDINALITY AS x(id, limit_key, queue_id, vtime, tenant_id, seq, priority, i)
        JOIN rota.keys k ON k.name = x.limit_key
    ), room AS MATERIALIZED (
        SELECT k.id, l.concurrency_limit - k.running AS free_slots,
               rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens, k.refilled_at) AS tokens,
               l.concurrency_limit IS NOT NULL AS counts, l.rate_limit IS NOT NULL AS rated
        FROM rota.keys k JOIN rota.key_limits l ON l.id = k.limit_id
        WHERE k.id = ANY (ARRAY(SELECT DISTINCT key FROM given))
        ORDER BY k.id
        FOR UPDATE OF k
    ), verdicts AS MATERIALIZED (
        SELECT g.*, r.counts,
               row_number() OVER (PARTITION BY g.key ORDER BY g.i)
                   <= least(coalesce(r.free_slots, 2147483647), coalesce(floor(r.tokens), 2147483647))
                   AS fits
        FROM given g JOIN room r ON r.id = g.key
    ), charged AS (
        UPDATE rota.keys k
        SET running = k.running + CASE WHEN r.counts THEN c.taken ELSE 0 END,
            tokens = CASE WHEN r.rated THEN r.tokens - c.taken ELSE k.tokens END,
            refilled_at = CASE WHEN r.rated THEN now() ELSE k.refilled_at END,
            parked = k.parked + c.set_aside
        FROM (SELECT v.key, count(*) FILTER (WHERE v.fits) AS taken,
                     count(*) FILTER (WHERE NOT v.fits) AS set_aside
              FROM verdicts v GROUP BY v.key) c
        JOIN room r ON r.id = c.key
        WHERE k.id = c.key AND k.id = ANY (ARRAY(SELECT id FROM room))
    ), set_aside AS (
        INSERT INTO rota.parked (key_id, queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT v.key, v.queue_id, v.vtime, v.tenant_id, v.seq, v.id, v.priority
        FROM verdicts v WHERE NOT v.fits
    )
    SELECT v.id, CASE WHEN v.counts AND v.fits THEN v.key END, v.fits FROM verdicts v;
    IF EXISTS (SELECT FROM rota.keys k WHERE k.parked > 0) THEN
        PERFORM rota.unpark();
    END IF;
END
$$;

-- Puts parked tasks of keys with room again back in line, each at its own
-- place (ahead of what was loaded since: it has waited its turn). A key's
-- room is its free slots and whole tokens; without its limit, all of them.
-- Key rows locked elsewhere are skipped: never waiting, this closes no
-- lock cycle, and the holder (a claim or a release) leads to the next call.
-- Returns how many went back.
CREATE FUNCTION rota.unpark() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_queues integer[];
    v_moved integer;
BEGIN
    WITH room AS MATERIALIZED (
        SELECT k.id, k.parked,
               least(k.parked,
                     coalesce(l.concurrency_limit - k.running, k.parked),
                     coalesce(floor(rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens,
                                                    k.refilled_at))::integer, k.parked)) AS n
        FROM rota.keys k LEFT JOIN rota.key_limits l ON l.id = k.limit_id
        WHERE k.parked > 0
          AND least(k.parked,
                    coalesce(l.concurrency_limit - k.running, k.parked),
                    coalesce(floor(rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens,
                                                   k.refilled_at))::integer, k.parked)) > 0
        ORDER BY k.id
        FOR UPDATE OF k SKIP LOCKED
    ), chosen AS MATERIALIZED (
        SELECT x.task_id, r.id AS key_id
        FROM room r
        CROSS JOIN LATERAL (
            SELECT p.task_id FROM rota.parked p WHERE p.key_id = r.id
            ORDER BY p.vtime, p.tenant_id, p.seq LIMIT r.n
        ) x
    ), moved AS MATERIALIZED (
        DELETE FROM rota.parked p WHERE p.task_id = ANY (ARRAY(SELECT task_id FROM chosen))
        RETURNING p.*
    ), back AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT m.queue_id, m.vtime, m.tenant_id, m.seq, m.task_id, m.priority FROM moved m
    ), recounted AS (
        -- Fewer found than counted (a parked task was cancelled): recounted.
        -- The statement's snapshot still holds the rows it moved.
        UPDATE rota.keys k
        SET parked = CASE WHEN coalesce(m.n, 0) < r.n
                          THEN (SELECT count(*) FROM rota.parked p WHERE p.key_id = r.id)
                               - coalesce(m.n, 0)
                          ELSE k.parked - m.n END
        FROM room r LEFT JOIN (SELECT key_id, count(*) AS n FROM moved GROUP BY key_id) m
               ON m.key_id = r.id
        WHERE k.id = r.id AND k.id = ANY (ARRAY(SELECT id FROM room))
    )
    SELECT array_agg(DISTINCT m.queue_id), count(*) INTO v_queues, v_moved FROM moved m;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q WHERE q.id = ANY (v_queues);
    RETURN v_moved;
END
$$;

-- Creates or changes a limit on keys (NULLs: no concurrency or rate
-- limit). Its keys' running counters are recounted when it gets or loses a
-- concurrency; a changed rate starts each key with a full bucket. Keys of
-- tasks already loaded are made. `p_declared`: set from code (a worker's
-- declaration), else an operator's (kept over declarations until reset).
CREATE FUNCTION rota.set_limit(p_name text, p_concurrency_limit integer,
                               p_rate_limit double precision, p_rate_burst double precision,
                               p_declared boolean, p_actor text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
    v_burst double precision := coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1)));
    v_keys text[];
    v_queues integer[];
BEGIN
    INSERT INTO rota.key_limits (name, concurrency_limit, rate_limit, rate_burst, declared)
    VALUES (p_name, p_concurrency_limit, p_rate_limit, v_burst, p_declared)
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = excluded.concurrency_limit, rate_limit = excluded.rate_limit,
        rate_burst = excluded.rate_burst, declared = excluded.declared, updated_at = now()
    RETURNING id INTO v_id;
    -- Keys left by a dropped limit of this name are this one's.
    UPDATE rota.keys SET limit_id = v_id
    WHERE split_part(name, '/', 1) = p_name AND limit_id <> v_id;
    -- Tasks loaded before (a scan of the table: a limit is set seldom).
    SELECT array_agg(DISTINCT t.limit_key), array_agg(DISTINCT t.queue_id)
    INTO v_keys, v_queues
    FROM rota.tasks t
    WHERE t.limit_key IS NOT NULL AND split_part(t.limit_key, '/', 1) = p_name;
    PERFORM rota.make_keys(v_keys, v_queues);
    -- Running rows first, then key rows: the order a release takes them in.
    UPDATE rota.running r
    SET key_id = CASE WHEN p_concurrency_limit IS NOT NULL THEN k.id END
    FROM rota.tasks t JOIN rota.keys k ON k.name = t.limit_key
    WHERE t.id = r.task_id AND k.limit_id = v_id AND t.limit_key IS NOT NULL
      AND r.key_id IS DISTINCT FROM CASE WHEN p_concurrency_limit IS NOT NULL THEN k.id END;
    UPDATE rota.keys k
    SET running = (SELECT count(*) FROM rota.running r WHERE r.key_id = k.id),
        tokens = v_burst, refilled_at = now()
    FROM (SELECT id FROM rota.keys WHERE limit_id = v_id ORDER BY id FOR UPDATE) locked
    WHERE k.id = locked.id;
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'set limit', 'limit:' || p_name,
            jsonb_build_object('concurrency', p_concurrency_limit, 'rate', p_rate_limit,
                               'burst', v_burst, 'declared', p_declared), 1);
    -- Parked tasks may have room now.
    PERFORM rota.unpark();
    RETURN v_id;
END
$$;

-- The limits an app's code declares, set as declared unless an operator set
-- them (rota.set_limit with p_declared false; `rota limit reset` hands a
-- limit back to its declaration). Unchanged ones are left alone. Returns the
-- names set.
CREATE FUNCTION rota.declare_limits(p_names text[], p_concurrency integer[],
                                    p_rates double precision[], p_bursts double precision[],
                                    p_actor text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    d record;
BEGIN
    FOR d IN
        SELECT x.name, x.concurrency, x.rate,
               coalesce(x.burst, greatest(1, coalesce(x.rate, 1))) AS burst
        FROM unnest(p_names, p_concurrency, p_rates, p_bursts) AS x(name, concurrency, rate, burst)
        LEFT JOIN rota.key_limits l ON l.name = x.name
        WHERE l.id IS NULL
           OR (l.declared AND (l.concurrency_limit, l.rate_limit, l.rate_burst)
                              IS DISTINCT FROM (x.concurrency, x.rate,
                                                coalesce(x.burst, greatest(1, coalesce(x.rate, 1)))))
        ORDER BY x.name
    LOOP
        PERFORM rota.set_limit(d.name, d.concurrency, d.rate, d.burst, true, p_actor);
        RETURN NEXT d.name;
    END LOOP;
END
$$;

-- Removes a limit: its keys' tasks run unlimited, the parked ones back in
-- line at their places. Returns false for an unknown name.
CREATE FUNCTION rota.drop_limit(p_name text, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM rota.key_limits WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    -- Running rows first, then key rows: the order a release takes them in.
    UPDATE rota.running r SET key_id = NULL
    WHERE r.key_id = ANY (ARRAY(SELECT k.id FROM rota.keys k WHERE k.limit_id = v_id));
    PERFORM FROM rota.keys k WHERE k.limit_id = v_id ORDER BY k.id FOR UPDATE;
    WITH moved AS (
        DELETE FROM rota.parked p
        WHERE p.key_id = ANY (ARRAY(SELECT k.id FROM rota.keys k WHERE k.limit_id = v_id))
        RETURNING p.*
    )
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
    SELECT m.queue_id, m.vtime, m.tenant_id, m.seq, m.task_id, m.priority FROM moved m;
    DELETE FROM rota.keys k WHERE k.limit_id = v_id;
    IF NOT EXISTS (SELECT FROM rota.key_limits) THEN
        UPDATE rota.queues SET key_limited = false WHERE key_limited;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, 'drop limit', 'limit:' || p_name, 1);
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q;
    RETURN true;
END
$$;

-- Workers declare their app's limits and put parked tasks back (a
-- maintenance duty) as the schema's owner.
ALTER FUNCTION rota.declare_limits(text[], integer[], double precision[], double precision[], text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION rota.unpark() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
