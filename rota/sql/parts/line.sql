-- The parts of rota.enter_line and rota.tasks_enter_line, each written once.
-- rota/sql/render.py composes the two functions of them
-- (functions/enter_line.sql, tasks_enter_line.sql: what runs); `make sql`
-- renders those files again. The fair line's other functions are in
-- functions/line.sql.
--
-- A part's first comment lines say what it is (a function's, its comment in
-- the rendered file); its text follows, up to the next `-- name:`. A slot
-- alone on its line, `{{name}}`, stands for lines (a part, or none); within a
-- line, for words.

-- name: enter_line
-- Makes tasks just promoted (or the rest of a load that met a task already
-- run, rota.tasks_enter_line) claimable at their fair places (start-time
-- fair queueing, docs/explanation/architecture.md): each (queue, tenant)
-- pair's tasks, in arrival (seq) order, start at S = max(V, F), the queue's
-- virtual clock or the tenant's finish tag, and move F on by cost / weight.
-- Saves each pair's finish tag and largest start tag, and notifies each
-- queue once. Called only by rota's definer functions: the tags come from
-- these rules, never from a caller. Its placement is rota.tasks_enter_line's
-- too, written once.
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
{{pair_variables}}
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_ids) <= 512 THEN
        -- Until the function returns (its SET clause restores the setting).
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    {{pairs}};
    {{placement}};
END
$body$;

-- name: tasks_enter_line
-- The insert trigger's function: puts the tasks an INSERT or COPY into
-- rota.tasks stored in line, or on the schedule when their ETA is later:
-- the places and tags computed by rota.enter_line's rules, never by the
-- caller. A row is inserted once, so it is put in line once: a second place
-- in line for a task would make every claim that meets it roll back. Only
-- tasks on their first attempt qualify. The statement's new rows come from
-- its transition table: nothing is read back. Its placement is
-- rota.enter_line's, reading the new rows where they are (passing them to
-- rota.enter_line as arrays costs a bulk load time for every task).
CREATE OR REPLACE FUNCTION rota.tasks_enter_line() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
{{pair_variables}}
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
    {{pairs}};
    IF v_pair_queues IS NULL THEN
        RETURN NULL;
    END IF;
    -- The placement, reading the new rows where they are.
    {{placement}};
    RETURN NULL;
END
$body$;

-- name: pair_variables
-- The (queue, tenant) pairs of the tasks to place, as rota.advance_tags takes
-- them, and how many it moved on.
    v_pair_queues integer[];
    v_pair_tenants integer[];
    v_pair_costs double precision[];
    v_pair_lasts double precision[];
    v_tagged integer;

-- name: pairs
-- The (queue, tenant) pairs of the tasks of {{source}} that {{pending_only}}
-- (a WHERE clause, or none) keeps, in (queue, tenant) order: each with its
-- tasks' total cost and its last one's (in arrival order).
SELECT array_agg(p.q ORDER BY p.q, p.t), array_agg(p.t ORDER BY p.q, p.t),
           array_agg(p.cost ORDER BY p.q, p.t), array_agg(p.last ORDER BY p.q, p.t)
    INTO v_pair_queues, v_pair_tenants, v_pair_costs, v_pair_lasts
    FROM (SELECT x.queue_id AS q, x.tenant_id AS t, sum(x.cost) AS cost,
               (array_agg(x.cost ORDER BY x.seq DESC))[1] AS last
        FROM {{source}}
{{pending_only}}
        GROUP BY 1, 2) p

-- name: placement
-- Places the tasks of {{source}} (id, seq, queue_id, tenant_id, cost,
-- priority) that {{pending_only}} keeps: their pairs' tags moved on
-- (rota.advance_tags, which locks them until the transaction ends), each
-- task starts at its pair's new finish tag less its cost and those of its
-- pair's tasks after it, in arrival (seq) order.
WITH tags AS MATERIALIZED (
        SELECT * FROM rota.advance_tags(v_pair_queues, v_pair_tenants, v_pair_costs,
                                        v_pair_lasts)
    ), ready AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT x.queue_id, g.finish - sum(x.cost) OVER w / g.weight, x.tenant_id, x.seq, x.id,
               x.priority
        FROM {{source}}
        JOIN tags g ON g.queue_id = x.queue_id AND g.tenant_id = x.tenant_id
{{pending_only}}
        WINDOW w AS (PARTITION BY x.queue_id, x.tenant_id ORDER BY x.seq DESC
                     ROWS UNBOUNDED PRECEDING)
    )
    SELECT count(*) FROM tags INTO v_tagged;
    -- A pair without its tag would leave its tasks out of line for good.
    IF v_tagged <> cardinality(v_pair_queues) THEN
        RAISE EXCEPTION 'rota.advance_tags moved % of % tags', v_tagged,
                        cardinality(v_pair_queues);
    END IF;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q
    WHERE q.id = ANY (v_pair_queues)

-- name: given_tasks
-- The tasks given to rota.enter_line, as arrays.
unnest(p_ids, p_seqs, p_queue_ids, p_tenant_ids, p_costs, p_priorities) AS x(id, seq, queue_id, tenant_id, cost, priority)

-- name: loaded_tasks
-- The statement's new rows (the trigger's transition table).
loaded x

-- name: pending_first_attempts
-- The new rows to place: pending, on their first attempt.
        WHERE x.attempts = 0 AND x.status = 'pending'
