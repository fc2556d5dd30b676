-- load_tasks of 0019 as first written (0019_definer_loads).
DROP FUNCTION IF EXISTS rota.load_tasks(uuid[], text[], text[], text[], text[], double precision[],
                                        integer[], double precision[], double precision[],
                                        timestamptz[], timestamptz[]);
ALTER TABLE rota.workers ADD COLUMN secret_hash bytea, ADD COLUMN heartbeat_seconds double precision;

CREATE TABLE rota.limits (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    finished_retention_floor interval NOT NULL DEFAULT '1 day',
    dead_retention_floor interval NOT NULL DEFAULT '7 days',
    worker_retention_floor interval NOT NULL DEFAULT '1 hour'
);
INSERT INTO rota.limits DEFAULT VALUES;
