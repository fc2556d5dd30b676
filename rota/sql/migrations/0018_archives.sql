-- rota 0018: the archive's ledger (`rota archive`).

-- Each `rota archive --before B` run: everything that ended before B and at
-- or after the previous run's B, written once to `location`. Retention, when
-- told to wait for the archive, keeps what ended at or after the last B.
CREATE TABLE rota.archives (
    before timestamptz PRIMARY KEY,
    since timestamptz,
    location text NOT NULL,
    tasks bigint NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);
