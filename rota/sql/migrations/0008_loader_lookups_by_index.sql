-- The loader's lookups by name and by (queue, tenant) are index probes
-- whatever the statistics say. PL/pgSQL keeps a function's plans for the
-- session: planned while tenant_queues looked empty (a new install, just
-- analyzed), fair_starts joined by scanning the whole table once per pair,
-- and inside one transaction that keeps loading (a Spark micro-batch) that
-- grew quadratic. Each
-- lookup is now a scalar subquery, and sequential scans are off inside.

CREATE OR REPLACE FUNCTION rota.name_ids(p_queues text[], p_tenants text[],
                              OUT queue_ids integer[], OUT tenant_ids integer[])
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    -- Lookups are scalar subqueries: each an index probe (joins could be
    -- planned as a scan of the whole table per name).
    INSERT INTO rota.queues (name)
    SELECT DISTINCT n FROM unnest(p_queues) n
    WHERE (SELECT q.id FROM rota.queues q WHERE q.name = n) IS NULL
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO rota.tenants (name)
    SELECT DISTINCT n FROM unnest(p_tenants) n
    WHERE (SELECT t.id FROM rota.tenants t WHERE t.name = n) IS NULL
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    queue_ids := ARRAY(
        SELECT (SELECT q.id FROM rota.queues q WHERE q.name = x.name)
        FROM unnest(p_queues) WITH ORDINALITY x(name, i) ORDER BY x.i);
    tenant_ids := ARRAY(
        SELECT (SELECT t.id FROM rota.tenants t WHERE t.name = x.name)
        FROM unnest(p_tenants) WITH ORDINALITY x(name, i) ORDER BY x.i);
END
$$;

CREATE OR REPLACE FUNCTION rota.fair_starts(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS TABLE (queue_id integer, tenant_id integer, weight double precision,
               start double precision)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM rota.lock_queues(ARRAY(SELECT DISTINCT unnest(p_queue_ids)));
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v FROM (SELECT DISTINCT unnest(p_queue_ids) AS id) q
    )
    SELECT p.queue_id, p.tenant_id,
           (SELECT t.weight FROM rota.tenants t WHERE t.id = p.tenant_id),
           greatest(c.v, coalesce((SELECT tq.finish_tag FROM rota.tenant_queues tq
                                   WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id),
                                  c.v))
    FROM unnest(p_queue_ids, p_tenant_ids) AS p(queue_id, tenant_id)
    JOIN clock c ON c.id = p.queue_id;
END
$$;
