CREATE SCHEMA IF NOT EXISTS rota;

CREATE TABLE rota.migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rota.queues (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CONSTRAINT queue_name_rule CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    max_start double precision NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rota.tenants (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE
        CONSTRAINT tenant_name_rule CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$'),
    weight double precision NOT NULL DEFAULT 1 CONSTRAINT weight_positive CHECK (weight > 0),
    concurrency_limit integer CONSTRAINT concurrency_limit_not_negative CHECK (concurrency_limit >= 0),
    rate_limit double precision CONSTRAINT rate_limit_positive CHECK (rate_limit > 0),
    rate_burst double precision NOT NULL DEFAULT 1 CONSTRAINT rate_burst_at_least_one CHECK (rate_burst >= 1),
    capacity bigint CONSTRAINT capacity_not_negative CHECK (capacity >= 0),
    running integer NOT NULL DEFAULT 0,
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    limited boolean GENERATED ALWAYS AS (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL) STORED,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenants_limited ON rota.tenants (id) WHERE limited;

CREATE TABLE rota.tenant_queues (
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    finish_tag double precision NOT NULL,
    PRIMARY KEY (queue_id, tenant_id)
);

CREATE TYPE rota.task_status AS ENUM ('pending', 'scheduled', 'dead');

CREATE SEQUENCE rota.task_seq AS bigint CACHE 1000;

CREATE TABLE rota.tasks (
    id uuid PRIMARY KEY,
    seq bigint NOT NULL DEFAULT nextval('rota.task_seq'),
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL,
    cost double precision NOT NULL DEFAULT 1 CONSTRAINT cost_positive CHECK (cost > 0),
    max_attempts integer NOT NULL DEFAULT 3 CONSTRAINT max_attempts_positive CHECK (max_attempts >= 1),
    backoff_base double precision NOT NULL DEFAULT 1,
    backoff_max double precision NOT NULL DEFAULT 3600,
    status rota.task_status NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    eta timestamptz,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    loaded_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    last_error text
) WITH (fillfactor = 90);

CREATE TABLE rota.ready (
    queue_id integer NOT NULL,
    vtime double precision NOT NULL,
    tenant_id integer NOT NULL,
    seq bigint NOT NULL,
    task_id uuid NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 100000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX ready_fair_order ON rota.ready (queue_id, vtime, tenant_id, seq);

CREATE TABLE rota.running (
    task_id uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    vtime double precision NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL,
    worker text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz NOT NULL,
    counted boolean NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE rota.finished (
    task_id uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    attempts integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX finished_at ON rota.finished USING brin (finished_at);

CREATE TABLE rota.scheduled (
    run_at timestamptz NOT NULL,
    task_id uuid NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX scheduled_run_at ON rota.scheduled (run_at);
