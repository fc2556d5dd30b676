ALTER TABLE rota.tenant_queues ADD COLUMN last_start double precision NOT NULL DEFAULT 0;
CREATE INDEX tenant_queues_last_start ON rota.tenant_queues (queue_id, last_start);

ALTER TABLE rota.loader_batches ADD COLUMN part integer NOT NULL DEFAULT 0;
ALTER TABLE rota.loader_batches DROP CONSTRAINT loader_batches_pkey;
ALTER TABLE rota.loader_batches ADD PRIMARY KEY (query, batch_id, part);

DROP FUNCTION IF EXISTS rota.lock_queues(integer[]);
