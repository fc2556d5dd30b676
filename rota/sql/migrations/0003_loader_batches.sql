CREATE TABLE rota.loader_batches (
    query text NOT NULL,  -- the streaming query's checkpoint: batch ids restart with it
    batch_id bigint NOT NULL,
    tasks integer NOT NULL,
    loaded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query, batch_id)
);
