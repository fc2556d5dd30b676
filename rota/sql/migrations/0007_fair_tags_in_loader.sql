-- rota 0007: fair tags are computed by the loader (rota.core.make_ready), and
-- tasks and their places in line are COPY'd straight into rota.tasks and
-- rota.ready. The staged path (COPY into a temp table, then INSERT ... SELECT
-- into both tables) wrote every row one at a time; COPY writes them a page at
-- a time. The database keeps the state the tags are computed from: these
-- functions lock a batch's queues and read it, and save what the batch moved.

DROP FUNCTION rota.load_staged();
DROP FUNCTION rota.promote_due(integer);
DROP FUNCTION rota.make_ready(uuid[], bigint[], integer[], integer[], double precision[]);

-- The ids of queue and tenant names, in the order given; unknown ones are
-- created, in name order (loaders creating the same ones cannot deadlock).
CREATE FUNCTION rota.name_ids(p_queues text[], p_tenants text[],
                              OUT queue_ids integer[], OUT tenant_ids integer[])
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.queues (name)
    SELECT DISTINCT n FROM unnest(p_queues) n
    WHERE NOT EXISTS (SELECT 1 FROM rota.queues q WHERE q.name = n)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO rota.tenants (name)
    SELECT DISTINCT n FROM unnest(p_tenants) n
    WHERE NOT EXISTS (SELECT 1 FROM rota.tenants t WHERE t.name = n)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    SELECT array_agg(q.id ORDER BY x.i) INTO queue_ids
    FROM unnest(p_queues) WITH ORDINALITY x(name, i) JOIN rota.queues q ON q.name = x.name;
    SELECT array_agg(t.id ORDER BY x.i) INTO tenant_ids
    FROM unnest(p_tenants) WITH ORDINALITY x(name, i) JOIN rota.tenants t ON t.name = x.name;
END
$$;

-- Where each (queue, tenant) pair's next task starts, S = max(V, F) (the
-- queue's virtual clock, the tenant's finish tag), and the tenant's weight.
-- Locks the queues first (rota.lock_queues): loaders and schedulers of the
-- same queue take turns, each reading settled tags, until they commit.
CREATE FUNCTION rota.fair_starts(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS TABLE (queue_id integer, tenant_id integer, weight double precision,
               start double precision)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rota.lock_queues(ARRAY(SELECT DISTINCT unnest(p_queue_ids)));
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v FROM (SELECT DISTINCT unnest(p_queue_ids) AS id) q
    )
    SELECT p.queue_id, p.tenant_id, t.weight, greatest(c.v, coalesce(tq.finish_tag, c.v))
    FROM unnest(p_queue_ids, p_tenant_ids) AS p(queue_id, tenant_id)
    JOIN clock c ON c.id = p.queue_id
    JOIN rota.tenants t ON t.id = p.tenant_id
    LEFT JOIN rota.tenant_queues tq ON tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id;
END
$$;

-- Records what the tasks just made ready (rota.core.make_ready) moved: each
-- pair's finish tag and each queue's largest start tag; notifies once per queue.
CREATE FUNCTION rota.save_fair_tags(
    p_queue_ids integer[], p_tenant_ids integer[], p_finish_tags double precision[],
    p_clock_queue_ids integer[], p_max_starts double precision[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
    SELECT * FROM unnest(p_queue_ids, p_tenant_ids, p_finish_tags) ORDER BY 1, 2
    ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = excluded.finish_tag;
    UPDATE rota.queues q SET max_start = greatest(q.max_start, m.s)
    FROM unnest(p_clock_queue_ids, p_max_starts) AS m(id, s)
    WHERE q.id = m.id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q WHERE q.id = ANY(p_clock_queue_ids);
END
$$;

