-- A run's start, recorded: the heartbeat marks a claim started
-- (running.started_at), a completion keeps its claim's time, its start and
-- the seconds it ran (the worker's measures); rota.stats counts prefetched
-- claims apart from running ones (rota.claims). Rows finished before keep
-- their started_at (the claim's time), claimed_at and ran_seconds NULL.
ALTER TABLE rota.running ADD COLUMN started_at timestamptz;
ALTER TABLE rota.finished ADD COLUMN claimed_at timestamptz,
                          ADD COLUMN ran_seconds double precision;
ALTER TABLE rota.stats ADD COLUMN prefetched bigint NOT NULL DEFAULT 0;

-- The completions and the heartbeat take the runs' measures as trailing
-- parameters with defaults: the previous release's calls still resolve.
DROP FUNCTION IF EXISTS rota.complete(uuid[], integer[]);
DROP FUNCTION IF EXISTS rota.complete_counted(uuid[], integer[]);
DROP FUNCTION IF EXISTS rota.complete_claim(uuid[], integer[], text[], integer, text,
                                            double precision);
DROP FUNCTION IF EXISTS rota.complete_keeping(uuid[], integer[], jsonb[], text[],
                                              double precision[]);
DROP FUNCTION IF EXISTS rota.complete_keeping_claim(uuid[], integer[], jsonb[], text[],
                                                    double precision[], text[], integer, text,
                                                    double precision);
DROP FUNCTION IF EXISTS rota.extend_leases(uuid[], integer[], double precision);
DROP FUNCTION IF EXISTS rota.worker_complete(text, bytea, uuid[], integer[]);
DROP FUNCTION IF EXISTS rota.worker_complete_claim(text, bytea, uuid[], integer[], text[], integer,
                                                   double precision);
DROP FUNCTION IF EXISTS rota.worker_complete_keeping(text, bytea, uuid[], integer[], jsonb[],
                                                     text[], double precision[]);
DROP FUNCTION IF EXISTS rota.worker_complete_keeping_claim(text, bytea, uuid[], integer[], jsonb[],
                                                           text[], double precision[], text[],
                                                           integer, double precision);
DROP FUNCTION IF EXISTS rota.worker_extend_leases(text, bytea, uuid[], integer[],
                                                  double precision);
