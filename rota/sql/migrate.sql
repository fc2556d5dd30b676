-- `rota migrate`.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: applied_migrations
SELECT version FROM rota.migrations ORDER BY version

-- name: migrations_table_exists
SELECT to_regclass('rota.migrations') IS NOT NULL

-- name: record_migration
INSERT INTO rota.migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_lock
-- Concurrent `rota migrate` runs take turns.
SELECT pg_advisory_xact_lock(hashtext('rota.core.migrate'))

-- name: recorded_function_files
SELECT name, checksum FROM rota.repeatables

-- name: record_function_file
INSERT INTO rota.repeatables (name, checksum) VALUES (%(name)s, %(checksum)s)
ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now()

-- name: revoke_public_execute
-- Functions run by anyone with EXECUTE, which PUBLIC has by default: only the
-- roles of `rota migrate --roles` (rota/sql/roles.sql) get it.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC

-- name: bound_lock_waits
-- Under live traffic a migration waits for a lock at most this long, and the
-- whole transaction is tried again (rota.core.migrate.LOCK_WAIT_SECONDS):
-- shorter than PostgreSQL's deadlock_timeout (1 s by default), so that it
-- gives up before a process waiting on it would detect a deadlock and fail.
SELECT set_config('lock_timeout', %(ms)s, true), set_config('statement_timeout', %(ms)s, true)

-- name: unbound_statements
-- After the locks: the statements are bound as the session's are.
SET LOCAL statement_timeout TO DEFAULT

-- name: lock_schema
-- Every table and view of the schema, in one statement and one order, before
-- any change: the changes then wait for nothing, and no process holds a
-- lock the migration wants while waiting for one it holds.
DO $lock$
DECLARE
    relations text;
BEGIN
    SELECT string_agg(c.oid::regclass::text, ', ' ORDER BY c.relname) INTO relations
    FROM pg_class c
    WHERE c.relnamespace = to_regnamespace('rota') AND c.relkind IN ('r', 'p', 'v', 'm');
    IF relations IS NOT NULL THEN
        EXECUTE 'LOCK TABLE ' || relations || ' IN ACCESS EXCLUSIVE MODE';
    END IF;
END
$lock$

-- name: schema_version_now
-- The schema version a database is at, and the oldest it supports (no row:
-- a database made before versions were recorded, or none at all).
SELECT version, supports_from FROM rota.schema_version

-- name: record_schema_version
INSERT INTO rota.schema_version (version, supports_from, checksum)
VALUES (%(version)s, %(supports_from)s, %(checksum)s)
ON CONFLICT (one) DO UPDATE
SET version = excluded.version, supports_from = excluded.supports_from,
    checksum = excluded.checksum, applied_at = now()

-- name: repeatables_table_exists
SELECT to_regclass('rota.repeatables') IS NOT NULL

-- name: schema_version_table_exists
SELECT to_regclass('rota.schema_version') IS NOT NULL
