ALTER TABLE rota.workers ADD COLUMN declared_dead boolean NOT NULL DEFAULT false;
