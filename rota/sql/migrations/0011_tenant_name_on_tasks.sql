-- A claim named each task's tenant with an index probe of rota.tenants per
-- task (100 per claim). Each task now carries the name, copied at load time,
-- so the claim reads it from the row it fetches anyway. Tasks loaded before this migration
-- have no copy; claims still look up their tenant's name.
ALTER TABLE rota.tasks ADD COLUMN tenant text;
