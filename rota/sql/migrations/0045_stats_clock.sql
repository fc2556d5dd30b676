-- rota 0045: rota.count_service and rota.refresh_stats take the time they
-- count at (p_now, the transaction's time by default): rota/sql/functions/
-- stats.sql defines them with it once this migration has dropped them.
-- Callers without it (`SELECT rota.refresh_stats()`) call the new ones.

DROP FUNCTION rota.count_service();
DROP FUNCTION rota.refresh_stats();
