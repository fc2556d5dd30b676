-- rota 0005: the Spark loader's ledger gets one row per (micro-batch, shard),
-- because each executor now loads its own shard's part of a batch.

ALTER TABLE rota.loader_batches ADD COLUMN stream text NOT NULL DEFAULT '';
ALTER TABLE rota.loader_batches ALTER COLUMN stream DROP DEFAULT;
ALTER TABLE rota.loader_batches DROP CONSTRAINT loader_batches_pkey;
ALTER TABLE rota.loader_batches ADD PRIMARY KEY (query, batch_id, stream);
