ALTER TYPE rota.task_status ADD VALUE IF NOT EXISTS 'cancelled';
