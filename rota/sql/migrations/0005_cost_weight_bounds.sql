ALTER TABLE rota.tasks DROP CONSTRAINT cost_positive;
ALTER TABLE rota.tasks ADD CONSTRAINT cost_bounded CHECK (cost > 0 AND cost <= 1e6);
ALTER TABLE rota.tenants DROP CONSTRAINT weight_positive;
ALTER TABLE rota.tenants ADD CONSTRAINT weight_bounded CHECK (weight >= 1e-6 AND weight <= 1e6);
