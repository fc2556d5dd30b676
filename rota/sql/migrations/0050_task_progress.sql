CREATE TABLE rota.progress (
    task_id uuid PRIMARY KEY,
    attempt integer NOT NULL,
    done double precision NOT NULL CONSTRAINT progress_done_bounded
        CHECK (done >= 0 AND done < 'Infinity'),
    total double precision CONSTRAINT progress_total_bounded
        CHECK (total >= done AND total < 'Infinity'),
    message text CONSTRAINT progress_message_bounded CHECK (length(message) <= 500),
    reported_at timestamptz NOT NULL DEFAULT now(),
    writes bigint NOT NULL DEFAULT 1
);
