-- rota 0033: rota.tasks and rota.finished are analyzed after 100,000 changed
-- rows at the least (and, as before, a tenth of the table beyond that). While
-- they are small and churn thousands of rows a second, autovacuum otherwise
-- analyzed both on every round (each second with autovacuum_naptime = 1s):
-- at 30,000 tasks/s that took about 5% of the pipeline's CPU, in bursts that
-- stalled the claims. The statements that read them go by key or by index;
-- their statistics move little between analyses.
ALTER TABLE rota.tasks SET (autovacuum_analyze_threshold = 100000);
ALTER TABLE rota.finished SET (autovacuum_analyze_threshold = 100000);
