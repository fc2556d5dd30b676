-- rota 0044: functions are defined once each, in rota/sql/functions/, which
-- `rota migrate` applies after the migrations (rota/core/migrate.py). This
-- records each file's checksum as last applied: a file is applied again when
-- its text changes.

CREATE TABLE rota.repeatables (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
