-- Bounds at every entrance (rota/model/rules.py); these CHECKs are the last line.
-- NOT VALID: rows stored before are not rechecked (an upgrade never fails on
-- an old row); every new or changed row is. A test compares them with the rules.
ALTER TABLE rota.tasks
    ADD CONSTRAINT task_name_rule
        CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*$'
               AND length(name) <= 200) NOT VALID,
    ADD CONSTRAINT max_attempts_bounded CHECK (max_attempts <= 10000) NOT VALID,
    ADD CONSTRAINT backoff_bounded
        CHECK (backoff_base >= 0 AND backoff_base <= 315360000
               AND backoff_max >= 0 AND backoff_max <= 315360000) NOT VALID,
    ADD CONSTRAINT eta_bounded
        CHECK (eta >= '2000-01-01 00:00:00+00' AND eta < '2200-01-01 00:00:00+00') NOT VALID,
    ADD CONSTRAINT enqueued_at_bounded
        CHECK (enqueued_at >= '2000-01-01 00:00:00+00'
               AND enqueued_at < '2200-01-01 00:00:00+00') NOT VALID;
ALTER TABLE rota.tenants
    ADD CONSTRAINT concurrency_limit_bounded CHECK (concurrency_limit <= 1000000) NOT VALID,
    ADD CONSTRAINT rate_limit_bounded CHECK (rate_limit <= 1e6) NOT VALID,
    ADD CONSTRAINT rate_burst_bounded CHECK (rate_burst <= 1e9) NOT VALID,
    ADD CONSTRAINT capacity_bounded CHECK (capacity <= 1000000000000) NOT VALID;

-- When a worker that did not know the task's name first handed it back.
ALTER TABLE rota.tasks ADD COLUMN unknown_since timestamptz;

-- Hands back claimed tasks whose name the worker's app does not know, for a
-- worker that knows it: each runs again p_delay seconds later with no attempt
-- used, until it has been unknown for p_grace seconds; then it is dead with
-- p_reason. Stale tokens are refused.
CREATE FUNCTION rota.defer_unknown(
    p_ids uuid[], p_attempts integer[], p_delay double precision, p_grace double precision,
    p_reason text
) RETURNS TABLE (id uuid, status rota.task_status)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH taken AS MATERIALIZED (
        SELECT r.task_id, r.attempt FROM rota.take_running(p_ids, p_attempts) r
    ), decided AS MATERIALIZED (
        SELECT t.id, k.attempt,
               coalesce(t.unknown_since, now()) <= now() - make_interval(secs => p_grace)
                   AS give_up
        FROM rota.tasks t JOIN taken k ON k.task_id = t.id
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM taken))
    ), later AS (
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now() + make_interval(secs => p_delay), d.id FROM decided d WHERE NOT d.give_up
    )
    UPDATE rota.tasks t
    SET status = CASE WHEN d.give_up THEN 'dead' ELSE 'scheduled' END::rota.task_status,
        unknown_since = coalesce(t.unknown_since, now()),
        attempts = CASE WHEN d.give_up THEN d.attempt ELSE t.attempts END,
        last_error = p_reason,
        finished_at = CASE WHEN d.give_up THEN now() END
    FROM decided d
    WHERE t.id = ANY (ARRAY(SELECT id FROM decided)) AND t.id = d.id
    RETURNING t.id, t.status;
END
$$;
