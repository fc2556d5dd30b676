ALTER TABLE rota.tasks SET (vacuum_truncate = false);
