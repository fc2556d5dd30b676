ALTER TABLE rota.queues ADD COLUMN charge_time boolean NOT NULL DEFAULT false,
    ADD COLUMN run_seconds double precision;
ALTER TABLE rota.tenant_queues ADD COLUMN run_seconds double precision;
