CREATE TABLE rota.schema_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version integer NOT NULL,
    supports_from integer NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
