-- A task cancelled by an operator ends as 'cancelled'. On its own: a new enum
-- value cannot be used in the transaction that adds it (0016 uses it).
ALTER TYPE rota.task_status ADD VALUE IF NOT EXISTS 'cancelled';
