DROP FUNCTION IF EXISTS rota.count_service();
DROP FUNCTION IF EXISTS rota.refresh_stats();
