-- The fair line (docs/explanation/architecture.md, "Fairness"): the queues'
-- virtual clocks and tenants' tags, and how loaded and promoted tasks take
-- their places in it. Functions that producers, loaders and workers call run
-- as the schema's owner, with a fixed search_path: those roles hold no UPDATE
-- or DELETE.

-- The queue's virtual clock: the smallest start tag still waiting, or the
-- largest ever given when nothing waits (each tenant's largest, through an
-- index; never below the queue's floor). Read without a lock: a load moves
-- its tenants' tags under their locks, whatever other tenants' loads do.
-- plpgsql: its plan is kept for the session, where a sql
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

-- A (queue, tenant) pair's weight in placement: the tenant's, divided by the
-- pair's mean run seconds (else the queue's, else 1) when the queue charges
-- by time (a task then costs its seconds). Inlined where it is called.
CREATE OR REPLACE FUNCTION rota.pair_weight(p_weight double precision, p_charge_time boolean,
                                            p_pair_seconds double precision,
                                            p_queue_seconds double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_weight / CASE WHEN p_charge_time
                           THEN greatest(coalesce(p_pair_seconds, p_queue_seconds, 1), 1e-6)
                           ELSE 1 END
$$;

-- Moves the finish tags of (queue, tenant) pairs on by their tasks' costs
-- (each pair once, in (queue, tenant) order; `p_costs` the sum of its
-- tasks', `p_lasts` its last task's): F = max(V, F) + cost / weight, and
-- the pair's largest start tag to where its last task starts. Returns each
-- pair's new F and weight: its tasks' places are F less the cost from each
-- on (rota.enter_line). Tags made for pairs seen the first time.
--
-- One UPDATE reads and writes each tag under its row lock, so loads of one
-- tenant take turns, each from the tag the other committed, and loads of
-- other tenants never wait. Rows are locked in (queue, tenant) order, as
-- every writer of tags locks them, so loads never deadlock: with seq and
-- bitmap scans and hash and merge joins off, every plan left walks the pairs
-- (given in that order; the clock in queue order) or the table's primary
-- key (the same order) on the outside of nested loops.
CREATE OR REPLACE FUNCTION rota.advance_tags(p_queue_ids integer[], p_tenant_ids integer[],
                                             p_costs double precision[],
                                             p_lasts double precision[])
RETURNS TABLE (queue_id integer, tenant_id integer, finish double precision,
               weight double precision)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off
SET enable_mergejoin = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    -- ON CONFLICT DO NOTHING writes nothing for a tag made meanwhile.
    INSERT INTO rota.tenant_queues (queue_id, tenant_id, finish_tag)
    SELECT p.q, p.t, 0 FROM unnest(p_queue_ids, p_tenant_ids) AS p(q, t)
    WHERE NOT EXISTS (SELECT FROM rota.tenant_queues tq
                      WHERE tq.queue_id = p.q AND tq.tenant_id = p.t)
    ORDER BY 1, 2
    ON CONFLICT (queue_id, tenant_id) DO NOTHING;
    RETURN QUERY
    WITH clock AS MATERIALIZED (  -- read once per queue, not once per tenant
        SELECT q.id, rota.vclock(q.id) AS v, q.charge_time, q.run_seconds
        FROM rota.queues q WHERE q.id = ANY (p_queue_ids) ORDER BY q.id
    ), pairs AS MATERIALIZED (
        SELECT p.q, p.t, p.cost, p.last,
               (SELECT t.weight FROM rota.tenants t WHERE t.id = p.t) AS weight
        FROM unnest(p_queue_ids, p_tenant_ids, p_costs, p_lasts) AS p(q, t, cost, last)
    )
    UPDATE rota.tenant_queues tq
    SET finish_tag = greatest(c.v, tq.finish_tag)
                     + p.cost / rota.pair_weight(p.weight, c.charge_time, tq.run_seconds,
                                                 c.run_seconds),
        last_start = greatest(c.v, tq.finish_tag)
                     + (p.cost - p.last) / rota.pair_weight(p.weight, c.charge_time,
                                                            tq.run_seconds, c.run_seconds)
    FROM pairs p JOIN clock c ON c.id = p.q
    WHERE tq.queue_id = p.q AND tq.tenant_id = p.t
    RETURNING tq.queue_id, tq.tenant_id, tq.finish_tag,
              rota.pair_weight(p.weight, c.charge_time, tq.run_seconds, c.run_seconds);
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
