CREATE TABLE rota.queue_history (
    minute timestamptz NOT NULL,
    queue_id integer NOT NULL,
    waiting bigint NOT NULL,
    running bigint NOT NULL,
    oldest_wait_seconds double precision,
    completed bigint NOT NULL DEFAULT 0,
    died bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue_id)
);
CREATE INDEX service_tenant_minute ON rota.service (tenant_id, minute);
