CREATE TABLE rota.archives (
    before timestamptz PRIMARY KEY,
    since timestamptz,
    location text NOT NULL,
    tasks bigint NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);
