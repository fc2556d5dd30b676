DROP FUNCTION IF EXISTS rota.key_admit(uuid[], integer[], double precision[], integer[], bigint[],
                             smallint[]);
