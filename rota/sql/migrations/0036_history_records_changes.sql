ALTER TABLE rota.stats DROP COLUMN at, ADD COLUMN recorded_at timestamptz,
    ADD COLUMN first_vtime double precision;
CREATE TABLE rota.stats_counted (
    only_row boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (only_row),
    at timestamptz NOT NULL
);
