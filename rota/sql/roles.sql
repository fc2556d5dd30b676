-- Least privilege (`rota migrate --roles`, or `--print-roles` for a DBA).
-- Roles without login; grant them to the users each component connects as:
--   rota_owner     owns the schema and runs `rota migrate`;
--   rota_producer  enqueues (the PostgreSQL fallback and `connection=`);
--   rota_loader    loads the buffer, and imports;
--   rota_worker    claims, reports, heartbeats, and runs maintenance;
--   rota_admin     the operations: the console, `rota task`, `rota tenant`, ...
-- Producers, loaders and workers change the queue only through SECURITY
-- DEFINER functions with a fixed search_path: none holds UPDATE or DELETE on
-- the queue's tables. Idempotent: `rota migrate` applies it again after
-- migrations whenever the roles exist, so new functions get their grants.

-- name: roles_exist
SELECT count(*) = 5 FROM pg_roles
WHERE rolname IN ('rota_owner', 'rota_producer', 'rota_loader', 'rota_worker', 'rota_admin')

-- name: can_become_owner
SELECT pg_has_role('rota_owner', 'USAGE')

-- name: become_owner
SET LOCAL ROLE rota_owner

-- name: reset_role
RESET ROLE

-- name: create_roles
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['rota_owner', 'rota_producer', 'rota_loader', 'rota_worker',
                             'rota_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
    EXECUTE format('GRANT CONNECT, CREATE ON DATABASE %I TO rota_owner', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO rota_producer, rota_loader, rota_worker, '
                   'rota_admin', current_database());
END
$roles$

-- name: own_schema
-- Everything in the schema belongs to rota_owner (the definer functions run as it).
DO $own$
DECLARE
    o record;
BEGIN
    ALTER SCHEMA rota OWNER TO rota_owner;
    FOR o IN SELECT c.oid::regclass AS name,
                    CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                   ELSE 'TABLE' END AS kind
             FROM pg_class c
             WHERE c.relnamespace = 'rota'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO rota_owner', o.kind, o.name);
    END LOOP;
    FOR o IN SELECT p.oid::regprocedure AS name FROM pg_proc p
             WHERE p.pronamespace = 'rota'::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO rota_owner', o.name);
    END LOOP;
    FOR o IN SELECT t.oid::regtype AS name FROM pg_type t
             WHERE t.typnamespace = 'rota'::regnamespace AND t.typtype = 'e'
    LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO rota_owner', o.name);
    END LOOP;
END
$own$

-- name: grant_roles
DO $grants$
BEGIN
    REVOKE ALL ON SCHEMA rota FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA rota FROM PUBLIC;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
    -- From nothing, so that what an older rota granted goes.
    REVOKE ALL ON ALL TABLES IN SCHEMA rota FROM rota_producer, rota_loader, rota_worker;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA rota FROM rota_producer, rota_loader, rota_worker;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM rota_producer, rota_loader, rota_worker;
    GRANT USAGE ON SCHEMA rota TO rota_producer, rota_loader, rota_worker, rota_admin;

    -- Loading (producers' fallback, loaders, and workers' cron): insert tasks
    -- (a definer trigger puts them in line, rota.tasks_enter_line); their
    -- names' ids through a definer function; see only ids of what exists or
    -- finished. rota.enter_line_of does nothing since 0028 (older loaders
    -- call it).
    GRANT INSERT ON rota.tasks TO rota_producer, rota_loader, rota_worker;
    GRANT SELECT (id) ON rota.tasks TO rota_producer, rota_loader, rota_worker;
    GRANT SELECT (task_id) ON rota.finished TO rota_producer, rota_loader, rota_worker;
    GRANT USAGE ON SEQUENCE rota.task_seq TO rota_producer, rota_loader, rota_worker;
    -- Every process reads the schema version when it connects (rota.core.versions).
    GRANT SELECT ON rota.schema_version TO rota_producer, rota_loader, rota_worker;
    GRANT EXECUTE ON FUNCTION rota.name_ids(text[], text[]),
                              rota.enter_line_of(uuid[]),
                              rota.vclock(integer)
        TO rota_producer, rota_loader, rota_worker;
    -- A task's result, by its id (what enqueue returned).
    GRANT EXECUTE ON FUNCTION rota.task_result(uuid) TO rota_producer, rota_worker;
    -- Workflows: a graph's joins and members, stored with its tasks.
    GRANT EXECUTE ON FUNCTION rota.add_workflow(uuid[], text[], json[], uuid[], uuid[], integer[],
                                                text, timestamptz)
        TO rota_producer, rota_worker;
    -- Backpressure: the producers read their tenants' backlog.
    GRANT SELECT ON rota.tenant_backlog TO rota_producer, rota_loader;
    -- The Spark loader's ledger of micro-batches.
    GRANT SELECT, INSERT, UPDATE ON rota.loader_batches TO rota_loader;

    -- Workers: claim, report, heartbeat as themselves (each call carries the
    -- worker's secret, rota.check_worker), and the maintenance duties.
    GRANT EXECUTE ON FUNCTION
        rota.register_worker(text, text, integer, text[], integer, bytea, double precision),
        rota.worker_claim(text, bytea, text[], integer, double precision),
        rota.worker_complete(text, bytea, uuid[], integer[], double precision[],
                             double precision[]),
        rota.worker_complete_claim(text, bytea, uuid[], integer[], text[], integer,
                                   double precision, double precision[], double precision[]),
        rota.worker_fail(text, bytea, uuid[], integer[], text[], timestamptz[], boolean[], text[]),
        rota.worker_release(text, bytea, uuid[], integer[]),
        rota.worker_defer_unknown(text, bytea, uuid[], integer[], double precision,
                                  double precision, text),
        rota.worker_extend_leases(text, bytea, uuid[], integer[], double precision,
                                  double precision[]),
        rota.worker_claims(text, bytea),
        rota.worker_beat(text, bytea),
        rota.worker_stop(text, bytea),
        rota.worker_rejoin(text, bytea),
        rota.record_run_times(text[], text[], integer[], double precision[]),
        rota.declare_limits(text[], integer[], double precision[], double precision[], text),
        rota.unpark(),
        rota.requeue_expired(),
        rota.promote_due(integer),
        rota.reap_workers(text[]),
        rota.reap_gone_workers(text[]),
        rota.reap_stopped_claims(interval),
        rota.prune_finished(interval, integer),
        rota.prune_dead(interval, integer),
        rota.prune_workers(interval),
        rota.prune_loader_batches(interval, integer),
        rota.prune_results(integer),
        rota.worker_complete_keeping(text, bytea, uuid[], integer[], jsonb[], text[],
                                     double precision[], double precision[], double precision[]),
        rota.worker_complete_keeping_claim(text, bytea, uuid[], integer[], jsonb[], text[],
                                           double precision[], text[], integer,
                                           double precision, double precision[],
                                           double precision[]),
        rota.wake_result_waiters(uuid[]),
        rota.count_service(timestamptz),
        rota.refresh_stats(timestamptz)
        TO rota_worker;
    -- Which workers are alive, for the maintenance leader (not their secrets).
    GRANT SELECT (id, host, pid, queues, concurrency, started_at, heartbeat_at, stopped_at)
        ON rota.workers TO rota_worker;
    GRANT SELECT (before) ON rota.archives TO rota_worker;  -- retention's bound

    -- Admins: everything, as the operator on a bad day.
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA rota TO rota_admin;
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA rota TO rota_admin;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA rota TO rota_admin;
    -- The audit log is append-only for admins: who did what stays.
    REVOKE UPDATE, DELETE, TRUNCATE ON rota.audit FROM rota_admin;
END
$grants$
