DROP FUNCTION IF EXISTS rota.save_fair_tags(integer[], integer[], double precision[], integer[],
                                  double precision[]);

CREATE UNLOGGED TABLE rota.lined (xact xid8 PRIMARY KEY, seq bigint NOT NULL);
