-- The parts of rota.claim, rota.complete_claim and rota.complete_keeping_claim,
-- each written once. rota/sql/render.py composes the three functions of them
-- (functions/claim.sql, complete_claim.sql, complete_keeping_claim.sql: what
-- runs, each case written out); `make sql` renders those files again.
--
-- A part's first comment lines say what it is (a function's, its comment in
-- the rendered file); its text follows, up to the next `-- name:`. A slot
-- alone on its line, `{{name}}`, stands for lines (a part, or none); within a
-- line, for words.

-- name: claim
-- Claims up to `limit` ready tasks of the given queues in fair order, in one
-- statement. Paused queues are not read; paused tenants, and tenants at their
-- concurrency limit or out of rate tokens, are skipped by the scan; the
-- admission below is the race-proof check. Tenants without limits (most)
-- skip the admission's locking, counting and ranking.
-- SECURITY DEFINER: a worker's role claims through it, holding no direct
-- UPDATE or DELETE on the tables.
--
-- One probe decides which of five statements runs: priority is looked at
-- only when these queues hold an urgent task at all (one probe of the
-- partial index ready_urgent), keys only in queues holding keyed tasks of a
-- limit (rota.queues.key_limited), and tenants' limits only when some tenant
-- is limited or paused (one probe of the partial index tenants_limited). One
-- statement: each costs an executor run. Left in the statement and skipped
-- at run time, a step would still cost every claim the setup of its CTEs
-- (docs/explanation/benchmarks.md). A tenant limited or paused after the
-- probe is seen by the next claim, as one limited after a statement's
-- snapshot always was.
--
-- rota.complete_claim and rota.complete_keeping_claim run the same
-- statements in their own bodies: a function shared by them would cost
-- every claim and report, on the hottest path, another call and another
-- copy of its rows. Sequential scans are off in all three, as in rota's
-- sessions, for sessions without rota's settings (behind a transaction
-- pooler): each probe stays on its index however small its table was when
-- the statement was planned.
CREATE OR REPLACE FUNCTION rota.claim(p_queues text[], p_limit integer, p_worker text,
                                      p_lease_seconds double precision)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz)
LANGUAGE plpgsql SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
#variable_conflict use_column
DECLARE
    v_urgent boolean;
    v_keys boolean;
    v_limited boolean;
BEGIN
{{claim}}
END
$body$;

-- name: complete_claim
-- Completes claimed tasks (stale tokens refused), then claims up to p_limit
-- as rota.claim does. The first row carries the outcome and no task: how
-- many were completed, and whether the claim ran. It does not run when a
-- completion locked a limited tenant's row: a claim locks tenant rows too,
-- and two workers each holding one tenant's lock while the other's claim
-- asks for it would deadlock; the worker then claims in a statement of its
-- own, as separate transactions always could. The claimed tasks follow, in
-- fair order.
CREATE OR REPLACE FUNCTION rota.complete_claim(p_ids uuid[], p_attempts integer[],
                                               p_queues text[], p_limit integer, p_worker text,
                                               p_lease_seconds double precision,
                                               p_started double precision[] DEFAULT NULL,
                                               p_ran double precision[] DEFAULT NULL)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
{{complete_then_claim}}
$body$;

-- name: complete_keeping_claim
-- rota.complete_claim for a batch whose completions keep results: each
-- task's result (p_values[i], or the reason p_refused[i], for p_ttls[i]
-- seconds; NULLs for a task that keeps none) kept with its completion, the
-- waiters woken, then the claim, in one statement.
CREATE OR REPLACE FUNCTION rota.complete_keeping_claim(p_ids uuid[], p_attempts integer[],
                                                       p_values jsonb[], p_refused text[],
                                                       p_ttls double precision[], p_queues text[],
                                                       p_limit integer, p_worker text,
                                                       p_lease_seconds double precision,
                                                       p_started double precision[] DEFAULT NULL,
                                                       p_ran double precision[] DEFAULT NULL)
RETURNS TABLE (id uuid, name text, payload text, queue text, tenant text, attempt integer,
               max_attempts integer, lease_expires_at timestamptz, enqueued_at timestamptz,
               completed integer, claimed boolean)
LANGUAGE plpgsql SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
{{complete_then_claim}}
$body$;

-- name: complete_then_claim
-- A body that completes with {{completion}} (each task completed, and
-- whether its tenant's count was kept), then claims with the claim's
-- statements ({{claim}}, in the function's own body: a call of rota.claim
-- would copy its rows again).
#variable_conflict use_column
DECLARE
    v_completed integer;
    v_locked boolean;
    v_urgent boolean;
    v_keys boolean;
    v_limited boolean;
BEGIN
    SELECT count(*), coalesce(bool_or(c.counted), false) INTO v_completed, v_locked
    FROM {{completion}} c;
    RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz,
                        v_completed, NOT v_locked;
    IF NOT v_locked THEN
{{claim}}
    END IF;
END

-- name: claim_probe
-- Whether these queues hold an urgent task, whether they hold keyed tasks of
-- a limit, and whether some tenant is limited or paused: which case runs.
    SELECT EXISTS (SELECT FROM rota.queues q JOIN rota.ready x ON x.queue_id = q.id
                   WHERE q.name = ANY (p_queues) AND x.priority > 0),
           EXISTS (SELECT FROM rota.queues q WHERE q.name = ANY (p_queues) AND q.key_limited),
           EXISTS (SELECT FROM rota.tenants t WHERE t.limited)
    INTO v_urgent, v_keys, v_limited;

-- name: first_in_line
-- No tenant limited: the first tasks in line, as they come.
        WITH admitted AS MATERIALIZED (
{{candidates}}

-- name: candidates
-- The first tasks in fair order of the queues ({{skip_tenants}}: the
-- tenants to skip, {{columns}}: more columns).
            SELECT c.*, q.name AS queue{{columns}}
            FROM rota.queues q
            CROSS JOIN LATERAL (
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
                FROM rota.ready r
                WHERE r.queue_id = q.id
{{skip_tenants}}
                ORDER BY r.vtime, r.tenant_id, r.seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) c
            WHERE q.name = ANY (p_queues) AND NOT q.paused
            ORDER BY c.vtime, c.tenant_id, c.seq
            LIMIT p_limit

-- name: blocked
-- The tenants a claim skips when some tenant is limited: `+ 0` hides the
-- column's statistics from this filter: when one tenant holds the whole
-- backlog they make the planner expect no row to pass it, and it then sorts
-- a seq scan of ready on every claim.
                  AND r.tenant_id + 0 <> ALL ((SELECT blocked FROM limits)::integer[])

-- name: admitted
-- The tasks admitted: in fair order ({{candidates}}), within their tenants'
-- limits.
        WITH limits AS MATERIALIZED (
            -- Every limited tenant (the partial index holds only those), and those
            -- that cannot take a task now.
            SELECT coalesce(array_agg(t.id), '{}') AS limited,
                   coalesce(array_agg(t.id) FILTER (
                       WHERE t.paused
                          OR t.running >= t.concurrency_limit
                          OR rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) < 1),
                       '{}') AS blocked
            FROM rota.tenants t
            WHERE t.limited
        ), candidates AS MATERIALIZED (
{{candidates}}
        ), limited AS MATERIALIZED (
            -- The candidates' limited tenants, locked in id order, as every writer of
            -- tenant counters locks them; FOR UPDATE reads the latest committed
            -- counters, so racing claims cannot both take the last free slot.
            SELECT t.id,
                   t.concurrency_limit - t.running AS free_slots,
                   rota.tokens_now(t.rate_limit, t.rate_burst, t.tokens, t.refilled_at) AS tokens
            FROM rota.tenants t
            WHERE t.limited AND t.id = ANY (ARRAY(
                SELECT DISTINCT c.tenant_id FROM candidates c
                WHERE c.tenant_id = ANY ((SELECT limited FROM limits)::integer[])))
            ORDER BY t.id
            FOR UPDATE
        ), admitted AS MATERIALIZED (
            -- Unlimited tenants' candidates as they are; a limited tenant's, in its
            -- order, as many as it has free slots and tokens.
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   false AS counted
            FROM candidates c
            WHERE c.tenant_id <> ALL ((SELECT limited FROM limits)::integer[])
            UNION ALL
            SELECT c.row_id, c.queue_id, c.queue, c.vtime, c.tenant_id, c.seq, c.task_id, c.priority,
                   l.free_slots IS NOT NULL
            FROM (
                SELECT candidates.*,
                       row_number() OVER (PARTITION BY tenant_id ORDER BY vtime, seq) AS nth
                FROM candidates
                WHERE tenant_id = ANY ((SELECT limited FROM limits)::integer[])
            ) c
            JOIN limited l ON l.id = c.tenant_id
            WHERE c.nth <= least(coalesce(l.free_slots, c.nth), coalesce(floor(l.tokens), c.nth))

-- name: priority
-- Priority (docs/explanation/architecture.md, "Fairness"): a tenant's
-- waiting tasks of a higher priority than its admitted ones take their
-- slots; the tasks claimed are then those picked.
        ), urgent AS MATERIALIZED (
            -- The slots are the admitted ones; a tenant's own waiting tasks of a
            -- higher priority than a slot's task may take it. Per admitted
            -- tenant and queue, at most as many as its slots, best first, from
            -- the partial index ready_urgent.
            SELECT u.row_id, u.queue_id, u.vtime, u.tenant_id, u.seq, u.task_id, u.priority
            FROM (SELECT a.queue_id, a.tenant_id, count(*) AS slots, min(a.priority) AS lowest
                  FROM admitted a GROUP BY a.queue_id, a.tenant_id) s
            CROSS JOIN LATERAL (
                SELECT r.ctid AS row_id, r.queue_id, r.vtime, r.tenant_id, r.seq, r.task_id,
                       r.priority
                FROM rota.ready r
                WHERE r.queue_id = s.queue_id AND r.tenant_id = s.tenant_id
                  AND r.priority > 0 AND r.priority > s.lowest
                  AND r.ctid <> ALL (ARRAY(SELECT a.row_id FROM admitted a))
                ORDER BY r.priority DESC, r.vtime, r.seq
                LIMIT s.slots
                FOR UPDATE SKIP LOCKED
            ) u
        ), ranked AS MATERIALIZED (
            -- A tenant's slots go to its best tasks among its admitted and urgent
            -- ones: highest priority first, then earliest in line.
            SELECT p.*,
                   row_number() OVER (PARTITION BY p.queue_id, p.tenant_id
                                      ORDER BY p.priority DESC, p.vtime, p.seq) AS best,
                   count(*) FILTER (WHERE p.slot) OVER (PARTITION BY p.queue_id, p.tenant_id)
                       AS slots
            FROM (
                SELECT a.row_id, a.queue_id, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority,
                       true AS slot
                FROM admitted a
                WHERE (a.queue_id, a.tenant_id) IN (SELECT u.queue_id, u.tenant_id FROM urgent u)
                UNION ALL
                SELECT u.row_id, u.queue_id, u.vtime, u.tenant_id, u.seq, u.task_id, u.priority, false
                FROM urgent u
            ) p
        ), swaps AS MATERIALIZED (
            -- Each admitted task that lost its slot pairs with an urgent task that
            -- won one, the earliest slot with the best: the urgent task runs in
            -- the slot (and keeps the slot's place while it runs), the other
            -- waits at the urgent task's place. The tenant's places, and so its
            -- share, are unchanged.
            SELECT l.row_id AS slot_row, w.row_id, w.vtime, w.seq, w.task_id, w.priority
            FROM (SELECT r.row_id, r.queue_id, r.tenant_id,
                         row_number() OVER (PARTITION BY r.queue_id, r.tenant_id
                                            ORDER BY r.vtime, r.seq) AS n
                  FROM ranked r WHERE r.slot AND r.best > r.slots) l
            JOIN (SELECT r.*,
                         row_number() OVER (PARTITION BY r.queue_id, r.tenant_id
                                            ORDER BY r.best) AS n
                  FROM ranked r WHERE NOT r.slot AND r.best <= r.slots) w
              ON w.queue_id = l.queue_id AND w.tenant_id = l.tenant_id AND w.n = l.n
        ), picked AS MATERIALIZED (
            -- The tasks claimed: the admitted ones, but in a swapped slot its urgent task.
            SELECT a.row_id, a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority,
                   a.counted
            FROM admitted a
            WHERE a.row_id <> ALL (ARRAY(SELECT s.slot_row FROM swaps s))
            UNION ALL
            SELECT s.row_id, a.queue_id, a.queue, a.vtime, a.tenant_id, s.seq, s.task_id, s.priority,
                   a.counted
            FROM swaps s JOIN admitted a ON a.row_id = s.slot_row
        ), displaced AS (
            -- A row of ready is never updated in place, so that a racing
            -- claim's SKIP LOCKED skips it rather than following it to a new
            -- version that its row ids (ctid) would not name: the displaced
            -- tasks' rows go, and come back at their new places.
            DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT slot_row FROM swaps))
        ), moved AS (
            INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
            SELECT a.queue_id, s.vtime, a.tenant_id, a.seq, a.task_id, a.priority
            FROM swaps s JOIN admitted a ON a.row_id = s.slot_row

-- name: taken
-- The tasks claimed ({{rows}}: admitted, or picked) leave the line;
-- {{limit_key}}: their keys, for the key stage.
        ), taken AS (
            -- Parked ones too: they leave the line.
            DELETE FROM rota.ready WHERE ctid = ANY (ARRAY(SELECT row_id FROM {{rows}}))
        ), claimed AS MATERIALIZED (
            SELECT a.queue_id, a.queue, a.vtime, a.tenant_id, a.seq, a.task_id, a.priority, a.counted,
                   t.tenant, t.name, t.payload, t.attempts + 1 AS attempt, t.max_attempts, t.enqueued_at,
                   now() + make_interval(secs => p_lease_seconds) AS lease_expires_at{{limit_key}}
            FROM {{rows}} a
            -- One probe of the primary key per task: OFFSET 0 keeps it a probe
            -- (flattened, the join was planned as a nested loop that sorted
            -- the whole batch's ids again for every task, or on a small
            -- table's statistics as a scan of the whole table).
            CROSS JOIN LATERAL (
                SELECT t.tenant, t.name, t.payload, t.attempts, t.max_attempts, t.enqueued_at,
                       t.limit_key
                FROM rota.tasks t WHERE t.id = a.task_id OFFSET 0
            ) t

-- name: key_stage
-- The claimed tasks that fit their keys' limits: those of queues holding
-- keyed tasks go through rota.key_admit.
        ), keyed AS MATERIALIZED (
            SELECT c.* FROM claimed c WHERE c.limit_key IS NOT NULL
        ), key_fit AS MATERIALIZED (
            -- Limits on keys (rota.key_admit) for the claimed tasks that name
            -- a key, and for parked tasks whose key has room. Neither (a
            -- batch of unkeyed tasks beside a saturated key): not called.
            -- Tenant rows are locked first (the subquery on `limited`).
            SELECT f.*
            FROM (SELECT WHERE (SELECT count(*) FROM limited) >= 0
                           AND (EXISTS (SELECT FROM keyed)
                                OR EXISTS (SELECT FROM rota.keys k
                                           JOIN rota.key_limits l ON l.id = k.limit_id
                                           WHERE k.parked > 0
                                             AND rota.key_room(k.parked, l.concurrency_limit,
                                                               k.running, l.rate_limit,
                                                               l.rate_burst, k.tokens,
                                                               k.refilled_at) > 0))) gate,
                 LATERAL rota.key_admit(
                     ARRAY(SELECT c.task_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.limit_key FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.queue_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.vtime FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.tenant_id FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.seq FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq),
                     ARRAY(SELECT c.priority FROM keyed c ORDER BY c.vtime, c.tenant_id, c.seq)) f
        ), final AS MATERIALIZED (
            -- The claimed tasks that fit (a parked one leaves the line, not
            -- for a worker). The count makes key_fit run even when nothing
            -- was claimed: it brings back parked tasks whose key has room.
            SELECT c.*, f.key_id
            FROM claimed c LEFT JOIN key_fit f ON f.task_id = c.task_id
            WHERE f.fits IS NOT false AND (SELECT count(*) FROM key_fit) >= 0

-- name: charged
-- The tasks that fit ({{rows}}: final, or in queues without keyed tasks
-- every task claimed) are counted for their tenants.
        ), charged AS (
            UPDATE rota.tenants t
            SET running = t.running + CASE WHEN t.concurrency_limit IS NULL THEN 0 ELSE a.n END,
                tokens = CASE WHEN t.rate_limit IS NULL THEN t.tokens ELSE l.tokens - a.n END,
                refilled_at = CASE WHEN t.rate_limit IS NULL THEN t.refilled_at ELSE now() END
            FROM (SELECT tenant_id, count(*) AS n FROM {{rows}} GROUP BY tenant_id) a
            JOIN limited l ON l.id = a.tenant_id
            -- The ANY keeps the planner on the key, even with a plan made on few tenants.
            WHERE t.id = a.tenant_id AND t.id = ANY (ARRAY(SELECT id FROM limited))

-- name: leased
-- The tasks that fit ({{rows}}) are leased ({{key_id}}: with the key that
-- counts each) and returned ({{outcome}}: the completion's columns, in
-- rota.complete_claim).
        ), leased AS (
            INSERT INTO rota.running (task_id, queue_id, tenant_id, vtime, seq, attempt, worker,
                                      lease_expires_at, counted, priority{{key_id}})
            SELECT task_id, queue_id, tenant_id, vtime, seq, attempt, p_worker, lease_expires_at, counted,
                   priority{{key_id}}
            FROM {{rows}}
        )
        SELECT c.task_id AS id, c.name, c.payload::text, c.queue,
               -- Looked up only for tasks stored before the name was copied to them.
               coalesce(c.tenant, (SELECT tn.name FROM rota.tenants tn WHERE tn.id = c.tenant_id))
                   AS tenant,
               c.attempt,
               c.max_attempts, c.lease_expires_at, c.enqueued_at{{outcome}}
        FROM {{rows}} c
        ORDER BY c.vtime, c.tenant_id, c.seq
