ALTER TABLE rota.tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD CONSTRAINT priority_bounded CHECK (priority >= 0 AND priority <= 9) NOT VALID;
ALTER TABLE rota.ready ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE rota.running ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX ready_urgent ON rota.ready (queue_id, tenant_id, priority DESC, vtime, seq)
    WHERE priority > 0;

DROP FUNCTION IF EXISTS rota.take_due(integer);

DROP FUNCTION IF EXISTS rota.enter_line(uuid[], bigint[], integer[], integer[], double precision[]);
