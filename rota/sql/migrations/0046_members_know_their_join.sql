ALTER TABLE rota.tasks ADD COLUMN join_id uuid;

UPDATE rota.tasks t SET join_id = m.join_id FROM rota.members m WHERE m.task_id = t.id;

DROP FUNCTION IF EXISTS rota.count_down_joins(uuid[]);
