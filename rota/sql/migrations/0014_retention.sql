CREATE INDEX tasks_dead ON rota.tasks (finished_at) WHERE status = 'dead';

DROP FUNCTION IF EXISTS rota.prune_finished(interval);
