-- A database made while 0020 or 0021 were being written lacks this floor,
-- or has a unique index that rota.lined replaced.
ALTER TABLE rota.limits
    ADD COLUMN IF NOT EXISTS worker_retention_floor interval NOT NULL DEFAULT '1 hour';
DROP INDEX IF EXISTS rota.ready_task;
