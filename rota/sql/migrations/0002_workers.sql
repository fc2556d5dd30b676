CREATE TABLE rota.workers (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    concurrency integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at timestamptz
);
CREATE INDEX workers_alive ON rota.workers (heartbeat_at) WHERE stopped_at IS NULL;
