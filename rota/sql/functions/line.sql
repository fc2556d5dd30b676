-- The fair line (docs/explanation/architecture.md, "Fairness"): the queues'
-- virtual clocks and tenants' tags, and how loaded and promoted tasks take
-- their places in it. Functions that producers, loaders and workers call run
-- as the schema's owner, with a fixed search_path: those roles hold no UPDATE
-- or DELETE.

-- The queue's virtual clock: the smallest start tag still waiting, or the
-- largest ever given when nothing waits (each tenant's largest, through an
-- index; never below the queue's floor). Read without a lock: a load places
-- its tenants after locking their tags, whatever other tenants' loads do.
-- plpgsql, as is lock_tags: its plan is kept for the session, where a sql
-- function that cannot be inlined (a definer) plans its statement on every
-- call of every load. The producers' backlog view reads it too.
CREATE OR REPLACE FUNCTION rota.vclock(p_queue_id integer) RETURNS double precision
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN coalesce(
        (SELECT r.vtime FROM rota.ready r WHERE r.queue_id = p_queue_id ORDER BY r.vtime LIMIT 1),
        greatest(
            (SELECT q.max_start FROM rota.queues q WHERE q.id = p_queue_id),
            (SELECT tq.last_start FROM rota.tenant_queues tq WHERE tq.queue_id = p_queue_id
             ORDER BY tq.last_start DESC LIMIT 1)),
        0);
END
$$;

-- Locks the tag rows of (queue, tenant) pairs, creating those missing, in
-- (queue, tenant) order: every writer of fair tags takes them the same way,
-- so loads never deadlock; loads of other tenants never wait. ON CONFLICT
-- ... WHERE false locks an existing row without writing it. A statement of
-- its own, before the placement's: that one then sees the rows made here.
CREATE OR REPLACE FUNCTION rota.lock_tags(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.tenant_queues AS tq (queue_id, tenant_id, finish_tag)
    SELECT p.q, p.t, 0 FROM unnest(p_queue_ids, p_tenant_ids) AS p(q, t) ORDER BY 1, 2
    ON CONFLICT (queue_id, tenant_id) DO UPDATE SET finish_tag = tq.finish_tag WHERE false;
END
$$;

-- The ids of queue and tenant names, in the order given; unknown ones are
-- created, in name order (loaders creating the same ones cannot deadlock).
CREATE OR REPLACE FUNCTION rota.name_ids(p_queues text[], p_tenants text[],
                                         OUT queue_ids integer[], OUT tenant_ids integer[])
LANGUAGE plpgsql
-- Index probes whatever the statistics say: planned on a small table, a
-- generic plan would keep scanning it whole once it grows.
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
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

-- Where each (queue, tenant) pair's next task starts, S = max(V, F) (the
-- queue's virtual clock, the tenant's finish tag), and the tenant's weight.
-- Called once the pairs' tags are locked (rota.lock_tags): loads of the same
-- tenant take turns, each reading settled tags, until they commit.
CREATE OR REPLACE FUNCTION rota.fair_starts(p_queue_ids integer[], p_tenant_ids integer[])
RETURNS TABLE (queue_id integer, tenant_id integer, weight double precision,
               start double precision)
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v, q.charge_time, q.run_seconds
        FROM (SELECT DISTINCT unnest(p_queue_ids) AS id) x JOIN rota.queues q ON q.id = x.id
    )
    SELECT p.queue_id, p.tenant_id,
           -- Charged by time, a task costs its pair's seconds per run: the
           -- weight is divided by them (placement divides cost by weight).
           (SELECT t.weight FROM rota.tenants t WHERE t.id = p.tenant_id)
               / CASE WHEN c.charge_time
                      THEN greatest(coalesce((SELECT tq.run_seconds FROM rota.tenant_queues tq
                                              WHERE tq.queue_id = p.queue_id
                                                AND tq.tenant_id = p.tenant_id),
                                             c.run_seconds, 1), 1e-6)
                      ELSE 1 END,
           greatest(c.v, coalesce((SELECT tq.finish_tag FROM rota.tenant_queues tq
                                   WHERE tq.queue_id = p.queue_id AND tq.tenant_id = p.tenant_id),
                                  c.v))
    FROM unnest(p_queue_ids, p_tenant_ids) AS p(queue_id, tenant_id)
    JOIN clock c ON c.id = p.queue_id;
END
$$;

-- Due scheduled tasks (ETA reached, retry backoff over), back to pending; they
-- get their fair place in line from rota.core.make_ready.
CREATE OR REPLACE FUNCTION rota.take_due(p_limit integer)
RETURNS TABLE (id uuid, seq bigint, queue_id integer, tenant_id integer,
               cost double precision, priority smallint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        DELETE FROM rota.scheduled
        WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM rota.scheduled WHERE run_at <= now()
            ORDER BY run_at LIMIT p_limit FOR UPDATE SKIP LOCKED))
        RETURNING task_id
    ), joined AS MATERIALIZED (
        -- Joins run with their members' results before their own arguments.
        SELECT j.task_id FROM rota.joins j WHERE j.task_id = ANY (ARRAY(SELECT task_id FROM due))
    ), promoted AS (
        UPDATE rota.tasks t
        SET status = 'pending',
            payload = CASE WHEN t.id = ANY (ARRAY(SELECT task_id FROM joined))
                           THEN rota.joined_payload(t.id) ELSE t.payload END
        WHERE t.id = ANY (ARRAY(SELECT task_id FROM due)) AND t.status = 'scheduled'
        RETURNING t.id, t.seq, t.queue_id, t.tenant_id, t.cost, t.priority
    )
    SELECT p.id, p.seq, p.queue_id, p.tenant_id, p.cost, p.priority FROM promoted p
    ORDER BY p.seq;
END
$$;

-- Moves due scheduled tasks (ETA reached, retry backoff over) into line, in
-- one transaction with their removal from the schedule.
CREATE OR REPLACE FUNCTION rota.promote_due(p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids uuid[];
    v_seqs bigint[];
    v_queues integer[];
    v_tenants integer[];
    v_costs double precision[];
    v_priorities smallint[];
BEGIN
    SELECT array_agg(d.id ORDER BY d.seq), array_agg(d.seq ORDER BY d.seq),
           array_agg(d.queue_id ORDER BY d.seq), array_agg(d.tenant_id ORDER BY d.seq),
           array_agg(d.cost ORDER BY d.seq), array_agg(d.priority ORDER BY d.seq)
    INTO v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities
    FROM rota.take_due(least(greatest(p_limit, 1), 100000)) d;
    PERFORM rota.enter_line(v_ids, v_seqs, v_queues, v_tenants, v_costs, v_priorities);
    RETURN coalesce(cardinality(v_ids), 0);
END
$$;

-- Loaders of rota before migration 0028 call this after their COPY; the
-- insert trigger (rota.tasks_enter_line) has put those tasks in line already.
CREATE OR REPLACE FUNCTION rota.enter_line_of(p_ids uuid[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ SELECT $$;
