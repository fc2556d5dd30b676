-- A database made while 0039 was being written has no released flag, and
-- another index on it (released holds exactly when nothing waits).
ALTER TABLE rota.joins ADD COLUMN IF NOT EXISTS released boolean NOT NULL DEFAULT false;
UPDATE rota.joins SET released = true WHERE waiting = 0 AND NOT released;
ALTER TABLE rota.joins SET (fillfactor = 50);
DROP INDEX rota.joins_waiting;
CREATE INDEX joins_waiting ON rota.joins (task_id) WHERE NOT released;

ALTER TABLE rota.tasks ADD COLUMN limit_key text,
    ADD CONSTRAINT limit_key_rule
        CHECK (limit_key ~ '^[a-z][a-z0-9_.-]{0,62}(/[^[:cntrl:]]{1,200})?$') NOT VALID;
ALTER TABLE rota.running ADD COLUMN key_id integer;
ALTER TABLE rota.queues ADD COLUMN key_limited boolean NOT NULL DEFAULT false;

CREATE TABLE rota.key_limits (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CONSTRAINT limit_name_rule CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    concurrency_limit integer
        CONSTRAINT limit_concurrency_bounded CHECK (concurrency_limit BETWEEN 0 AND 1000000),
    rate_limit double precision CONSTRAINT limit_rate_bounded CHECK (rate_limit > 0 AND rate_limit <= 1e6),
    rate_burst double precision NOT NULL DEFAULT 1
        CONSTRAINT limit_burst_bounded CHECK (rate_burst >= 1 AND rate_burst <= 1e9),
    declared boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rota.keys (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    limit_id integer NOT NULL,
    running integer NOT NULL DEFAULT 0,
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    parked integer NOT NULL DEFAULT 0
);
CREATE INDEX keys_of_limit ON rota.keys (limit_id);
CREATE INDEX keys_parked ON rota.keys (id) WHERE parked > 0;

CREATE TABLE rota.parked (
    key_id integer NOT NULL,
    queue_id integer NOT NULL,
    vtime double precision NOT NULL,
    tenant_id integer NOT NULL,
    seq bigint NOT NULL,
    task_id uuid NOT NULL PRIMARY KEY,
    priority smallint NOT NULL DEFAULT 0
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
CREATE INDEX parked_order ON rota.parked (key_id, vtime, tenant_id, seq);

CREATE VIEW rota.limit_usage AS
SELECT l.name, l.concurrency_limit, l.rate_limit, l.rate_burst, l.declared, l.updated_at,
       count(k.id) AS keys,
       coalesce(sum(k.running), 0) AS running,
       coalesce(max(k.running), 0) AS busiest_running,
       (SELECT count(*) FROM rota.parked p JOIN rota.keys pk ON pk.id = p.key_id
        WHERE pk.limit_id = l.id) AS parked
FROM rota.key_limits l LEFT JOIN rota.keys k ON k.limit_id = l.id
GROUP BY l.id;
