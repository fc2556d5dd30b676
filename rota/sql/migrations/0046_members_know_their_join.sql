-- rota 0046: a workflow's member carries its join's id on its task row
-- (rota.tasks.join_id, equal to rota.members.join_id), loaded with it: its
-- completion counts the join down from the row it deletes anyway, where it
-- looked each member up in rota.members. rota.count_down_joins now takes the
-- joins (one per member completed), so it is made again by
-- rota/sql/functions/workflows.sql.

ALTER TABLE rota.tasks ADD COLUMN join_id uuid;

-- Members loaded before: they know their join too.
UPDATE rota.tasks t SET join_id = m.join_id FROM rota.members m WHERE m.task_id = t.id;

DROP FUNCTION rota.count_down_joins(uuid[]);
