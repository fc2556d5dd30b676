ALTER TABLE rota.ready SET (vacuum_truncate = false);
ALTER TABLE rota.running SET (vacuum_truncate = false);
ALTER TABLE rota.scheduled SET (vacuum_truncate = false);
