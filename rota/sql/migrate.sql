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
