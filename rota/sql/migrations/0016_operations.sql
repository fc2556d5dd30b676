ALTER TABLE rota.queues ADD COLUMN paused boolean NOT NULL DEFAULT false;

ALTER TABLE rota.tenants ADD COLUMN paused boolean NOT NULL DEFAULT false;
DROP INDEX rota.tenants_limited;
ALTER TABLE rota.tenants DROP COLUMN limited;
ALTER TABLE rota.tenants ADD COLUMN limited boolean GENERATED ALWAYS AS
    (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL OR paused) STORED;
CREATE INDEX tenants_limited ON rota.tenants (id) WHERE limited;

ALTER TABLE rota.tasks
    ADD COLUMN traceback text,
    ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;

DROP FUNCTION IF EXISTS rota.fail(uuid[], integer[], text[], timestamptz[], boolean[]);
-- fail as 0001 first made it (databases made before 0002 existed).
DROP FUNCTION IF EXISTS rota.fail(uuid[], integer[], text[], timestamptz[]);

CREATE TABLE rota.audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,  -- 'task', 'queue:NAME', 'tenant:NAME', 'dead', ...
    detail jsonb NOT NULL DEFAULT '{}',
    count bigint NOT NULL
);
CREATE INDEX audit_at ON rota.audit (at);
CREATE INDEX audit_task_ids ON rota.audit USING gin ((detail -> 'ids'));

CREATE INDEX tasks_cancelled ON rota.tasks (finished_at) WHERE status = 'cancelled';

CREATE TABLE rota.service (
    minute timestamptz NOT NULL,
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    completed integer NOT NULL,
    wait_seconds double precision NOT NULL,  -- summed enqueue -> start waits
    PRIMARY KEY (minute, queue_id, tenant_id)
);
CREATE TABLE rota.service_counted (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    up_to timestamptz NOT NULL
);

CREATE TABLE rota.stats (
    queue_id integer NOT NULL,
    tenant_id integer NOT NULL,
    waiting bigint NOT NULL,
    running bigint NOT NULL,
    scheduled bigint NOT NULL,
    dead bigint NOT NULL,
    oldest_enqueued_at timestamptz,
    at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, tenant_id)
);
