ALTER TABLE rota.tasks SET (autovacuum_analyze_threshold = 100000);
ALTER TABLE rota.finished SET (autovacuum_analyze_threshold = 100000);
