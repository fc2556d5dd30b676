ALTER TABLE rota.queue_history
    ADD COLUMN waiting_max bigint,
    ADD COLUMN running_max bigint,
    ADD COLUMN oldest_wait_max double precision,
    ADD COLUMN fair_level double precision;
ALTER TABLE rota.service ADD COLUMN pending bigint;
ALTER TABLE rota.finished ADD COLUMN max_attempts integer, ADD COLUMN cost double precision;
