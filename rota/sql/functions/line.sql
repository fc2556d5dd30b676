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

-- rota.enter_line makes tasks just promoted (or the rest of a load that met
-- a task already run, rota.tasks_enter_line) claimable at their fair places
-- (start-time fair queueing, docs/architecture.md): each (queue, tenant)
-- pair's tasks, in arrival (seq) order, start at S = max(V, F), the queue's
-- virtual clock or the tenant's finish tag, and move F on by cost / weight.
-- Saves each pair's finish tag and largest start tag, and
-- notifies each queue once. Called only by rota's definer functions: the tags
-- come from these rules, never from a caller.
--
-- rota.tasks_enter_line, the insert trigger's function, puts the tasks an
-- INSERT or COPY into rota.tasks stored in line, or on the schedule when
-- their ETA is later: the places and tags computed by rota.enter_line's
-- rules, never by the caller. A row is inserted once, so it is
-- put in line once: a second place in line for a task would make every claim
-- that meets it roll back. Only tasks on their first attempt qualify. The
-- statement's new rows come from its transition table: nothing is read back.
--
-- Both place their tasks with one statement, written once below: the
-- trigger's function reads the new rows where they are, in its transition
-- table (passing them to rota.enter_line as arrays costs a bulk load time
-- for every task). A DO block puts the two functions together (EXECUTE
-- format()).
DO $make$
DECLARE
    -- Places the tasks of %1$s (id, seq, queue_id, tenant_id, cost,
    -- priority) that %2$s (a WHERE clause, or none) keeps, once the tags of
    -- their (queue, tenant) pairs are locked.
    v_placement constant text := $part$WITH starts AS MATERIALIZED (
        SELECT * FROM rota.fair_starts(v_pair_queues, v_pair_tenants)
    ), placed AS MATERIALIZED (
        SELECT x.queue_id, x.tenant_id, x.seq, x.id, x.priority,
               s.start + sum(x.cost / s.weight) OVER w - x.cost / s.weight AS vtime,
               s.start + sum(x.cost / s.weight) OVER w AS finish
        FROM %1$s
        JOIN starts s ON s.queue_id = x.queue_id AND s.tenant_id = x.tenant_id%2$s
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq
                     ROWS UNBOUNDED PRECEDING)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT queue_id, vtime, tenant_id, seq, id, priority FROM placed
    )
    UPDATE rota.tenant_queues tq SET finish_tag = m.finish, last_start = m.start
    FROM (SELECT queue_id, tenant_id, max(finish) AS finish, max(vtime) AS start
          FROM placed GROUP BY 1, 2) m
    WHERE tq.queue_id = m.queue_id AND tq.tenant_id = m.tenant_id;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (ARRAY(SELECT DISTINCT unnest(v_pair_queues)))$part$;
BEGIN
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION rota.enter_line(p_ids uuid[], p_seqs bigint[], p_queue_ids integer[],
                                           p_tenant_ids integer[], p_costs double precision[],
                                           p_priorities smallint[])
RETURNS void
-- Custom plans for large promotions: the arrays' sizes decide the joins (a
-- generic plan, which rota's sessions otherwise force, guesses them). Up to
-- 512 tasks the generic plans are as fast, and planning would cost a
-- one-task promotion more than running its statements does.
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_custom_plan AS $body$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_ids) <= 512 THEN
        -- Until the function returns (its SET clause restores the setting).
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT q, t FROM unnest(p_queue_ids, p_tenant_ids) AS x(q, t)) pairs;
    -- The pairs' tags stay locked until the transaction ends.
    PERFORM rota.lock_tags(v_pair_queues, v_pair_tenants);
    %s;
END
$body$
$function$, format(v_placement, 'unnest(p_ids, p_seqs, p_queue_ids, p_tenant_ids, p_costs, '
                                  'p_priorities) AS x(id, seq, queue_id, tenant_id, cost, priority)', ''));
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION rota.tasks_enter_line() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    v_pair_queues integer[];
    v_pair_tenants integer[];
    v_ran uuid[];
BEGIN
    -- The keys their limits count (only while some limit exists).
    IF EXISTS (SELECT FROM rota.key_limits) THEN
        PERFORM rota.make_keys(ARRAY(SELECT DISTINCT f.limit_key FROM loaded f
                                     WHERE f.limit_key IS NOT NULL),
                               ARRAY(SELECT DISTINCT f.queue_id FROM loaded f
                                     WHERE f.limit_key IS NOT NULL));
    END IF;
    -- A batch loaded again brings back no task that has run. The load looked
    -- before inserting (which keeps its count right); a task that finished
    -- meanwhile, while the insert waited on its row's deletion, is seen here.
    v_ran := ARRAY(SELECT f.task_id FROM rota.finished f
                   WHERE f.task_id = ANY (ARRAY(SELECT l.id FROM loaded l)));
    IF v_ran <> '{}' THEN
        -- Rare: those rows go, and the rest go in line through
        -- rota.enter_line, which leaves the statements below (and their
        -- cached plans) as every other load runs them.
        DELETE FROM rota.tasks WHERE id = ANY (v_ran);
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT coalesce(f.eta, now()), f.id FROM loaded f
        WHERE f.attempts = 0 AND f.status = 'scheduled' AND f.id <> ALL (v_ran);
        PERFORM rota.enter_line(array_agg(f.id ORDER BY f.seq), array_agg(f.seq ORDER BY f.seq),
                                array_agg(f.queue_id ORDER BY f.seq),
                                array_agg(f.tenant_id ORDER BY f.seq),
                                array_agg(f.cost ORDER BY f.seq),
                                array_agg(f.priority ORDER BY f.seq))
        FROM loaded f
        WHERE f.attempts = 0 AND f.status = 'pending' AND f.id <> ALL (v_ran);
        RETURN NULL;
    END IF;
    INSERT INTO rota.scheduled (run_at, task_id)
    SELECT coalesce(f.eta, now()), f.id FROM loaded f
    WHERE f.attempts = 0 AND f.status = 'scheduled';
    SELECT array_agg(q ORDER BY q, t), array_agg(t ORDER BY q, t)
    INTO v_pair_queues, v_pair_tenants
    FROM (SELECT DISTINCT f.queue_id AS q, f.tenant_id AS t FROM loaded f
          WHERE f.attempts = 0 AND f.status = 'pending') pairs;
    IF v_pair_queues IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM rota.lock_tags(v_pair_queues, v_pair_tenants);
    -- The placement, reading the new rows where they are.
    %s;
    RETURN NULL;
END
$body$
$function$, format(v_placement, 'loaded x', '
        WHERE x.attempts = 0 AND x.status = ''pending'''));
END
$make$;

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
