CREATE TABLE rota.results (
    task_id uuid PRIMARY KEY,
    value jsonb,  -- NULL when refused, or once expired
    refused text,  -- why no value is kept: it was too big, or not JSON
    expires_at timestamptz NOT NULL
);
CREATE INDEX results_expire ON rota.results (expires_at) WHERE value IS NOT NULL;
CREATE INDEX results_expired ON rota.results (task_id) WHERE value IS NULL;
