ALTER TABLE rota.tasks ADD COLUMN tenant text;
