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
