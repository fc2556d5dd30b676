DROP FUNCTION IF EXISTS rota.load_staged();
DROP FUNCTION IF EXISTS rota.promote_due(integer);
DROP FUNCTION IF EXISTS rota.make_ready(uuid[], bigint[], integer[], integer[], double precision[]);
