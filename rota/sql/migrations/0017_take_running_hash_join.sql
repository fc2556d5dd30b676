-- rota 0017: completions, failures and hand-backs find their running rows
-- through a hash join of their tokens (it was planned as a nested loop).

-- Takes claimed tasks off the running table, keeping each limited tenant's
-- counter right. Tenant rows are locked in id order, as claims lock them.
-- One statement: plpgsql keeps its plan, where a sql function would plan it
-- on every call (this runs on every completion). A hash join of the tokens:
-- planned on a near-empty running table, the join became a nested loop that
-- compared every running row with every token (2 ms for 100 completions, and
-- quadratic in a mass requeue).
CREATE OR REPLACE FUNCTION rota.take_running(p_ids uuid[], p_attempts integer[])
RETURNS SETOF rota.running
LANGUAGE plpgsql SET enable_nestloop = off AS $$
BEGIN
    RETURN QUERY
    WITH taken AS MATERIALIZED (
        DELETE FROM rota.running r
        USING unnest(p_ids, p_attempts) AS x(id, attempt)
        -- The ANY keeps the planner on the key however many tasks are running.
        WHERE r.task_id = ANY (p_ids) AND r.task_id = x.id
          AND (x.attempt IS NULL OR r.attempt = x.attempt)
        RETURNING r.*
    ), counted AS (
        SELECT tenant_id, count(*) AS n FROM taken WHERE counted GROUP BY tenant_id
    ), locked AS MATERIALIZED (
        -- Nothing is locked when no limited tenant is among them.
        SELECT t.id FROM rota.tenants t
        WHERE t.id = ANY (ARRAY(SELECT tenant_id FROM counted))
        ORDER BY t.id FOR UPDATE
    ), uncounted AS (
        UPDATE rota.tenants t SET running = greatest(t.running - c.n, 0)
        FROM counted c
        WHERE t.id = ANY (ARRAY(SELECT id FROM locked)) AND t.id = c.tenant_id
    )
    SELECT * FROM taken;
END
$$;
