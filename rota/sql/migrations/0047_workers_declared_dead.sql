-- rota 0047: a worker declared dead for its silence is told apart from one
-- that stopped or whose process is gone (rota.workers.declared_dead): it may
-- only be cut off, so what it holds goes back in line as its leases pass,
-- never sooner (rota.reap_workers and rota.reap_stopped_claims, made again by
-- rota/sql/functions/workers.sql).

ALTER TABLE rota.workers ADD COLUMN declared_dead boolean NOT NULL DEFAULT false;
