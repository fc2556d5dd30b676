ALTER TABLE rota.tasks
    ADD CONSTRAINT task_name_rule
        CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*$'
               AND length(name) <= 200) NOT VALID,
    ADD CONSTRAINT max_attempts_bounded CHECK (max_attempts <= 10000) NOT VALID,
    ADD CONSTRAINT backoff_bounded
        CHECK (backoff_base >= 0 AND backoff_base <= 315360000
               AND backoff_max >= 0 AND backoff_max <= 315360000) NOT VALID,
    ADD CONSTRAINT eta_bounded
        CHECK (eta >= '2000-01-01 00:00:00+00' AND eta < '2200-01-01 00:00:00+00') NOT VALID,
    ADD CONSTRAINT enqueued_at_bounded
        CHECK (enqueued_at >= '2000-01-01 00:00:00+00'
               AND enqueued_at < '2200-01-01 00:00:00+00') NOT VALID;
ALTER TABLE rota.tenants
    ADD CONSTRAINT concurrency_limit_bounded CHECK (concurrency_limit <= 1000000) NOT VALID,
    ADD CONSTRAINT rate_limit_bounded CHECK (rate_limit <= 1e6) NOT VALID,
    ADD CONSTRAINT rate_burst_bounded CHECK (rate_burst <= 1e9) NOT VALID,
    ADD CONSTRAINT capacity_bounded CHECK (capacity <= 1000000000000) NOT VALID;

ALTER TABLE rota.tasks ADD COLUMN unknown_since timestamptz;
