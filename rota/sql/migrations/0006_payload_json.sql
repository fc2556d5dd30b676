ALTER TABLE rota.tasks ALTER COLUMN payload TYPE json USING payload::json;
