-- The parts of rota.take_running, rota.complete_counted and rota.complete,
-- each written once. rota/sql/render.py composes the three functions of them
-- (functions/take_running.sql, complete_counted.sql, complete.sql: what
-- runs, each statement written out); `make sql` renders those files again.
-- The other reports' functions are in functions/reports.sql.
--
-- A part's first comment lines say what it is (a function's, its comment in
-- the rendered file); its text follows, up to the next `-- name:`. A slot
-- alone on its line, `{{name}}`, stands for lines (a part, or none); within a
-- line, for words.

-- name: take_running
-- Takes claimed tasks off the running table, keeping each limited tenant's
-- and key's counter right. Tenant rows, then key rows, are locked in id
-- order, as claims lock them. A hash join of the tokens: planned on a
-- near-empty running table, the join became a nested loop that compared
-- every running row with every token (2 ms for 100 completions, and
-- quadratic in a mass requeue); enable_nestloop is off where it runs. So is
-- JIT in the completion's statement: the join release's nested loop, costed
-- at 1e10 when disabled, would have it compiled on every call in a session
-- that leaves JIT on.
--
-- Its statement is the head of the completion's too (rota.complete), so
-- that a completion runs in one function: a nested function call costs
-- every report a call and a copy of its rows. In plpgsql, each keeps its
-- plan.
CREATE OR REPLACE FUNCTION rota.take_running(p_ids uuid[], p_attempts integer[])
RETURNS SETOF rota.running
LANGUAGE plpgsql SET enable_nestloop = off AS $body$
{{acting_worker}}
BEGIN
    RETURN QUERY
{{take}}
    )
    SELECT * FROM taken;
END
$body$;

-- name: complete_counted
-- rota.complete's work, saying of each task completed whether its tenant's
-- running counter counted it (its tenant row was locked to uncount it): for
-- rota.complete_claim and rota.complete_keeping.
CREATE OR REPLACE FUNCTION rota.complete_counted(p_ids uuid[], p_attempts integer[],
                                                 p_started double precision[] DEFAULT NULL,
                                                 p_ran double precision[] DEFAULT NULL)
RETURNS TABLE (task_id uuid, counted boolean)
LANGUAGE plpgsql SET enable_nestloop = off SET jit = off AS $body$
#variable_conflict use_column
{{completion}}
$body$;

-- name: complete
-- Finishes claimed tasks successfully. Returns the ids completed; an id
-- whose attempt token is stale (the lease expired and the task was given to
-- someone else) is refused and left alone. p_started[i] and p_ran[i]: the
-- seconds from the task's claim to its run's start, and the seconds it ran,
-- as its worker measured them on its monotonic clock (NULL: not told; its
-- start is then its heartbeat's record, else its claim's time).
CREATE OR REPLACE FUNCTION rota.complete(p_ids uuid[], p_attempts integer[],
                                         p_started double precision[] DEFAULT NULL,
                                         p_ran double precision[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
                 SET enable_nestloop = off SET jit = off AS $body$
{{completion}}
$body$;

-- name: acting_worker
-- Set by rota.check_worker: a worker takes only what it holds.
DECLARE
    v_worker text := nullif(current_setting('rota.acting_worker', true), '');

-- name: completion
-- A completion's body: the lean statement ({{lean}}), then the whole one
-- ({{whole}}) for what it left; {{lean_returns}} and {{whole_returns}}: what
-- each returns of the tasks completed.
{{acting_worker}}
    v_done integer;
BEGIN
    -- The tasks counted for no tenant and no key, while no join waits (most).
    RETURN QUERY
{{lean}}
    )
    {{lean_returns}};
    GET DIAGNOSTICS v_done = ROW_COUNT;
    IF v_done < cardinality(p_ids) THEN
        -- What that left (tasks counted for a tenant or a key, any while a
        -- join waits, stale tokens), with their tenants and keys uncounted.
        RETURN QUERY
{{whole}}
    )
        {{whole_returns}};
    END IF;
END

-- name: take_rows
-- The running rows of these tasks, taken ({{lean_only}}: more conditions;
-- {{reported}}: the reports' arrays, {{times}}: what of them each row keeps).
    WITH taken AS MATERIALIZED (
        DELETE FROM rota.running r
        USING {{reported}}
        -- The ANY keeps the planner on the key however many tasks are running.
        WHERE r.task_id = ANY (p_ids) AND r.task_id = x.id
          -- A worker's report (an attempt token) counts only within its
          -- lease: past it the worker holds nothing (the task is requeued
          -- and may run elsewhere), whatever kept it silent.
          AND (x.attempt IS NULL OR (r.attempt = x.attempt AND r.lease_expires_at > now()))
          AND (v_worker IS NULL OR r.worker = v_worker)
{{lean_only}}
        RETURNING r.*{{times}}

-- name: lean_only
-- The tasks counted for no tenant and no key, while no join waits (most):
-- no tenant or key row to lock and uncount, no join to release. Only rows
-- as they are when deleted qualify: one counted meanwhile (a limit set)
-- waits for the whole statement.
          AND NOT r.counted AND r.key_id IS NULL
          AND NOT EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)

-- name: uncount
-- The taken tasks' tenants and keys count them no more.
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
    ), keys_counted AS (
        SELECT key_id, count(*) AS n FROM taken WHERE key_id IS NOT NULL GROUP BY key_id
    ), keys_locked AS MATERIALIZED (
        -- After the tenants' rows (the subquery on `locked` runs first), as
        -- claims lock them; nothing is locked when no key counts.
        SELECT k.id FROM rota.keys k
        WHERE k.id = ANY (ARRAY(SELECT key_id FROM keys_counted))
          AND (SELECT count(*) FROM locked) >= 0
        ORDER BY k.id FOR UPDATE
    ), keys_uncounted AS (
        UPDATE rota.keys k SET running = greatest(k.running - c.n, 0)
        FROM keys_counted c
        WHERE k.id = ANY (ARRAY(SELECT id FROM keys_locked)) AND k.id = c.key_id

-- name: done_rows
-- The taken tasks, read once their tenants and keys are locked.
    ), done AS MATERIALIZED (
        -- Read after keys_locked: tenant and key rows are locked before the
        -- tasks' rows, as when the tasks were taken in a statement of their own.
        SELECT t.task_id, t.queue_id, t.tenant_id, t.attempt, t.claimed_at, t.counted, t.key_id,
               t.started_at, t.started, t.ran
        FROM taken t
        WHERE (SELECT count(*) FROM keys_locked) >= 0

-- name: stored
-- The tasks of {{rows}} leave rota.tasks (a delete is far cheaper than
-- rewriting the wide row) for the narrow rota.finished log.
    ), gone AS (
        -- `t.id = ANY(ARRAY(...))` keeps the planner on the primary key.
        DELETE FROM rota.tasks t WHERE t.id = ANY (ARRAY(SELECT d.task_id FROM {{rows}} d))
        RETURNING t.id, t.enqueued_at, t.max_attempts, t.cost, t.join_id
    ), stored AS (
        INSERT INTO rota.finished (task_id, queue_id, tenant_id, attempts, enqueued_at, started_at,
                                   max_attempts, cost, claimed_at, ran_seconds)
        -- Its start: the claim's time and the worker's measure from it (no
        -- clock skew between them), else the heartbeat's record, else the
        -- claim's time.
        SELECT d.task_id, d.queue_id, d.tenant_id, d.attempt, g.enqueued_at,
               coalesce(d.claimed_at + make_interval(secs => d.started), d.started_at, d.claimed_at),
               g.max_attempts, g.cost, d.claimed_at, d.ran
        FROM {{rows}} d JOIN gone g ON g.id = d.task_id
        RETURNING task_id

-- name: release
-- A join whose last member this was is released.
    ), released AS (
        -- The joins whose last member this was: due now (still waiting, not
        -- dead or cancelled meanwhile).
        -- The countdown drives the statement (a function scan), never a
        -- subquery that the plan may skip; it runs only while some join
        -- waits (one probe of joins_waiting otherwise).
        INSERT INTO rota.scheduled (run_at, task_id)
        SELECT now(), j.id
        FROM (SELECT WHERE EXISTS (SELECT FROM rota.joins w WHERE NOT w.released)) gate,
             LATERAL rota.count_down_joins(
                 ARRAY(SELECT g.join_id FROM gone g WHERE g.join_id IS NOT NULL)) AS j(id)
        WHERE (SELECT t.status FROM rota.tasks t WHERE t.id = j.id) = 'scheduled'

-- name: completed
-- The tasks completed.
SELECT s.task_id FROM stored s

-- name: completed_uncounted
-- The tasks completed, none counted (the lean statement's).
SELECT s.task_id, false FROM stored s

-- name: completed_counted
-- The tasks completed, and whether a tenant or key counted each.
SELECT s.task_id, d.counted OR d.key_id IS NOT NULL
        FROM stored s JOIN done d ON d.task_id = s.task_id
