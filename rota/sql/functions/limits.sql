-- Limits (docs/howto/limits.md): tenants' concurrency and rate limits, and
-- limits on keys, which tasks of any tenant name (rota.key_limits, rota.keys).

-- A tenant's tokens now: its rate limit's bucket, refilled since it was last
-- charged, up to its burst; NULL without a rate limit (least() would skip a
-- NULL, so the CASE keeps it). Plain SQL, so the planner inlines it.
CREATE OR REPLACE FUNCTION rota.tokens_now(p_rate double precision, p_burst double precision,
                                           p_tokens double precision, p_refilled_at timestamptz)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_rate IS NOT NULL
                THEN least(p_burst, p_tokens + p_rate * extract(epoch FROM now() - p_refilled_at))
           END
$$;

-- How many of a key's parked tasks its limit has room for now: its free
-- slots and whole tokens, up to its parked count; without its limit (NULLs),
-- all of them. Plain SQL, so the planner inlines it.
CREATE OR REPLACE FUNCTION rota.key_room(p_parked integer, p_concurrency_limit integer,
                                         p_running integer, p_rate double precision,
                                         p_burst double precision, p_tokens double precision,
                                         p_refilled_at timestamptz)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT least(p_parked, coalesce(p_concurrency_limit - p_running, p_parked),
                 coalesce(floor(rota.tokens_now(p_rate, p_burst, p_tokens, p_refilled_at))::integer,
                          p_parked))
$$;

-- Creates or changes a tenant. The running counter is recounted when a
-- concurrency limit is set (a task being reported at that instant runs on
-- uncounted); a fresh rate limit starts with a full bucket.
CREATE OR REPLACE FUNCTION rota.configure_tenant(
    p_name text, p_weight double precision, p_concurrency_limit integer,
    p_rate_limit double precision, p_rate_burst double precision, p_capacity bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    INSERT INTO rota.tenants (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT id INTO v_id FROM rota.tenants WHERE name = p_name FOR UPDATE;
    -- The tenant's row is held: no running row is waited for (a completion
    -- deleting it may wait for the tenant's row). One locked meanwhile keeps
    -- its mark, and the counter counts the rows marked.
    UPDATE rota.running SET counted = (p_concurrency_limit IS NOT NULL)
    WHERE task_id = ANY (ARRAY(SELECT r.task_id FROM rota.running r WHERE r.tenant_id = v_id
                               FOR UPDATE SKIP LOCKED));
    UPDATE rota.tenants SET
        weight = p_weight,
        concurrency_limit = p_concurrency_limit,
        rate_limit = p_rate_limit,
        rate_burst = coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1))),
        capacity = p_capacity,
        running = CASE WHEN p_concurrency_limit IS NULL THEN 0
                       ELSE (SELECT count(*) FROM rota.running r
                             WHERE r.tenant_id = v_id AND r.counted) END,
        tokens = coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1))),
        refilled_at = now()
    WHERE id = v_id;
    RETURN v_id;
END
$$;

-- Keys of limits for names of tasks just loaded into these queues (made on
-- first sight, in name order: loads making the same ones cannot deadlock),
-- and the queues marked as checking them (once: a marked queue's row is not
-- written). A name whose limit does not exist gets no row: its tasks run
-- unlimited.
CREATE OR REPLACE FUNCTION rota.make_keys(p_names text[], p_queue_ids integer[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- A new key's bucket starts full, as a new limit's does.
    INSERT INTO rota.keys (name, limit_id, tokens)
    SELECT n, l.id, l.rate_burst
    FROM unnest(p_names) n JOIN rota.key_limits l ON l.name = split_part(n, '/', 1)
    WHERE NOT EXISTS (SELECT FROM rota.keys k WHERE k.name = n)
    ORDER BY n
    ON CONFLICT (name) DO NOTHING;
    IF EXISTS (SELECT FROM unnest(p_names) n
               JOIN rota.key_limits l ON l.name = split_part(n, '/', 1)) THEN
        UPDATE rota.queues q SET key_limited = true
        WHERE q.id = ANY (p_queue_ids) AND NOT q.key_limited;
    END IF;
END
$$;

-- A claim's admission on keys (rota.claim calls it for queues holding tasks
-- of a limit): of the keyed tasks given in line order (with their keys),
-- each whose key is limited takes a free
-- slot and a token of it, as many as the key has; the others are parked.
-- Keys are locked in id order, after the claim's tenant rows, as every
-- writer of key counters locks them; FOR UPDATE reads the latest committed
-- counters, so racing claims cannot both take a key's last slot. Then parked
-- tasks of keys with room go back in line (rota.unpark): last, as nothing
-- after it in the claim waits for a lock. Returns each keyed task's verdict
-- and, when its key counts it, the key.
CREATE OR REPLACE FUNCTION rota.key_admit(p_ids uuid[], p_keys text[], p_queue_ids integer[],
                                          p_vtimes double precision[], p_tenant_ids integer[],
                                          p_seqs bigint[], p_priorities smallint[])
RETURNS TABLE (task_id uuid, key_id integer, fits boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH given AS MATERIALIZED (
        SELECT x.*, k.id AS key
        FROM unnest(p_ids, p_keys, p_queue_ids, p_vtimes, p_tenant_ids, p_seqs, p_priorities)
                 WITH ORDINALITY AS x(id, limit_key, queue_id, vtime, tenant_id, seq, priority, i)
        JOIN rota.keys k ON k.name = x.limit_key
    ), room AS MATERIALIZED (
        SELECT k.id, l.concurrency_limit - k.running AS free_slots,
               rota.tokens_now(l.rate_limit, l.rate_burst, k.tokens, k.refilled_at) AS tokens,
               l.concurrency_limit IS NOT NULL AS counts, l.rate_limit IS NOT NULL AS rated
        FROM rota.keys k JOIN rota.key_limits l ON l.id = k.limit_id
        WHERE k.id = ANY (ARRAY(SELECT DISTINCT key FROM given))
        ORDER BY k.id
        FOR UPDATE OF k
    ), verdicts AS MATERIALIZED (
        SELECT g.*, r.counts,
               row_number() OVER (PARTITION BY g.key ORDER BY g.i)
                   <= least(coalesce(r.free_slots, 2147483647), coalesce(floor(r.tokens), 2147483647))
                   AS fits
        FROM given g JOIN room r ON r.id = g.key
    ), charged AS (
        UPDATE rota.keys k
        SET running = k.running + CASE WHEN r.counts THEN c.taken ELSE 0 END,
            tokens = CASE WHEN r.rated THEN r.tokens - c.taken ELSE k.tokens END,
            refilled_at = CASE WHEN r.rated THEN now() ELSE k.refilled_at END,
            parked = k.parked + c.set_aside
        FROM (SELECT v.key, count(*) FILTER (WHERE v.fits) AS taken,
                     count(*) FILTER (WHERE NOT v.fits) AS set_aside
              FROM verdicts v GROUP BY v.key) c
        JOIN room r ON r.id = c.key
        WHERE k.id = c.key AND k.id = ANY (ARRAY(SELECT id FROM room))
    ), set_aside AS (
        INSERT INTO rota.parked (key_id, queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT v.key, v.queue_id, v.vtime, v.tenant_id, v.seq, v.id, v.priority
        FROM verdicts v WHERE NOT v.fits
    )
    SELECT v.id, CASE WHEN v.counts AND v.fits THEN v.key END, v.fits FROM verdicts v;
    IF EXISTS (SELECT FROM rota.keys k WHERE k.parked > 0) THEN
        PERFORM rota.unpark();
    END IF;
END
$$;

-- Puts parked tasks of keys with room again back in line, each at its own
-- place (ahead of what was loaded since: it has waited its turn). A key's
-- room is its free slots and whole tokens; without its limit, all of them.
-- Key rows locked elsewhere are skipped: never waiting, this closes no
-- lock cycle, and the holder (a claim or a release) leads to the next call.
-- Returns how many went back. A maintenance duty of workers, run as the
-- schema's owner.
CREATE OR REPLACE FUNCTION rota.unpark() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queues integer[];
    v_moved integer;
    v_short integer[];
BEGIN
    WITH room AS MATERIALIZED (
        SELECT k.id, k.parked,
               rota.key_room(k.parked, l.concurrency_limit, k.running, l.rate_limit,
                             l.rate_burst, k.tokens, k.refilled_at) AS n
        FROM rota.keys k LEFT JOIN rota.key_limits l ON l.id = k.limit_id
        WHERE k.parked > 0
          AND rota.key_room(k.parked, l.concurrency_limit, k.running, l.rate_limit,
                            l.rate_burst, k.tokens, k.refilled_at) > 0
        ORDER BY k.id
        FOR UPDATE OF k SKIP LOCKED
    ), chosen AS MATERIALIZED (
        SELECT x.task_id, r.id AS key_id
        FROM room r
        CROSS JOIN LATERAL (
            SELECT p.task_id FROM rota.parked p WHERE p.key_id = r.id
            ORDER BY p.vtime, p.tenant_id, p.seq LIMIT r.n
        ) x
    ), moved AS MATERIALIZED (
        DELETE FROM rota.parked p WHERE p.task_id = ANY (ARRAY(SELECT task_id FROM chosen))
        RETURNING p.*
    ), back AS (
        INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
        SELECT m.queue_id, m.vtime, m.tenant_id, m.seq, m.task_id, m.priority FROM moved m
    ), counted AS MATERIALIZED (
        SELECT r.id, r.n, coalesce(m.n, 0) AS moved
        FROM room r LEFT JOIN (SELECT key_id, count(*) AS n FROM moved GROUP BY key_id) m
               ON m.key_id = r.id
    ), uncounted AS (
        UPDATE rota.keys k SET parked = k.parked - c.moved
        FROM counted c
        WHERE k.id = c.id AND k.id = ANY (ARRAY(SELECT id FROM room))
    )
    SELECT array_agg(DISTINCT m.queue_id), count(*),
           ARRAY(SELECT c.id FROM counted c WHERE c.moved < c.n)
    INTO v_queues, v_moved, v_short FROM moved m;
    -- Fewer found than counted: a parked task was cancelled, or a claim that
    -- committed after this statement's snapshot (before its lock) parked
    -- tasks this snapshot does not see (counted in it, they would stay
    -- parked and uncounted, never brought back). Recounted by a statement
    -- of its own: its snapshot sees every committed row of those keys, and
    -- while their rows stay locked no claim parks more of them.
    IF v_short <> '{}' THEN
        UPDATE rota.keys k
        SET parked = (SELECT count(*) FROM rota.parked p WHERE p.key_id = k.id)
        WHERE k.id = ANY (v_short);
    END IF;
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q WHERE q.id = ANY (v_queues);
    RETURN v_moved;
END
$$;

-- Creates or changes a limit on keys (NULLs: no concurrency or rate
-- limit). Its keys' running counters are recounted when it gets or loses a
-- concurrency; a changed rate starts each key with a full bucket. Keys of
-- tasks already loaded are made. `p_declared`: set from code (a worker's
-- declaration), else an operator's (kept over declarations until reset).
CREATE OR REPLACE FUNCTION rota.set_limit(p_name text, p_concurrency_limit integer,
                                          p_rate_limit double precision,
                                          p_rate_burst double precision,
                                          p_declared boolean, p_actor text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
    v_burst double precision := coalesce(p_rate_burst, greatest(1, coalesce(p_rate_limit, 1)));
    v_keys text[];
    v_queues integer[];
BEGIN
    INSERT INTO rota.key_limits (name, concurrency_limit, rate_limit, rate_burst, declared)
    VALUES (p_name, p_concurrency_limit, p_rate_limit, v_burst, p_declared)
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = excluded.concurrency_limit, rate_limit = excluded.rate_limit,
        rate_burst = excluded.rate_burst, declared = excluded.declared, updated_at = now()
    RETURNING id INTO v_id;
    -- Keys left by a dropped limit of this name are this one's.
    UPDATE rota.keys SET limit_id = v_id
    WHERE split_part(name, '/', 1) = p_name AND limit_id <> v_id;
    -- Tasks loaded before (a scan of the table: a limit is set seldom).
    SELECT array_agg(DISTINCT t.limit_key), array_agg(DISTINCT t.queue_id)
    INTO v_keys, v_queues
    FROM rota.tasks t
    WHERE t.limit_key IS NOT NULL AND split_part(t.limit_key, '/', 1) = p_name;
    PERFORM rota.make_keys(v_keys, v_queues);
    -- Running rows first, then key rows: the order a release takes them in.
    UPDATE rota.running r
    SET key_id = CASE WHEN p_concurrency_limit IS NOT NULL THEN k.id END
    FROM rota.tasks t JOIN rota.keys k ON k.name = t.limit_key
    WHERE t.id = r.task_id AND k.limit_id = v_id AND t.limit_key IS NOT NULL
      AND r.key_id IS DISTINCT FROM CASE WHEN p_concurrency_limit IS NOT NULL THEN k.id END;
    UPDATE rota.keys k
    SET running = (SELECT count(*) FROM rota.running r WHERE r.key_id = k.id),
        tokens = v_burst, refilled_at = now()
    FROM (SELECT id FROM rota.keys WHERE limit_id = v_id ORDER BY id FOR UPDATE) locked
    WHERE k.id = locked.id;
    INSERT INTO rota.audit (actor, action, target, detail, count)
    VALUES (p_actor, 'set limit', 'limit:' || p_name,
            jsonb_build_object('concurrency', p_concurrency_limit, 'rate', p_rate_limit,
                               'burst', v_burst, 'declared', p_declared), 1);
    -- Parked tasks may have room now.
    PERFORM rota.unpark();
    RETURN v_id;
END
$$;

-- The limits an app's code declares, set as declared unless an operator set
-- them (rota.set_limit with p_declared false; `rota limit reset` hands a
-- limit back to its declaration). Unchanged ones are left alone. Returns the
-- names set. Workers declare them as the schema's owner.
CREATE OR REPLACE FUNCTION rota.declare_limits(p_names text[], p_concurrency integer[],
                                               p_rates double precision[],
                                               p_bursts double precision[],
                                               p_actor text) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d record;
BEGIN
    FOR d IN
        SELECT x.name, x.concurrency, x.rate,
               coalesce(x.burst, greatest(1, coalesce(x.rate, 1))) AS burst
        FROM unnest(p_names, p_concurrency, p_rates, p_bursts) AS x(name, concurrency, rate, burst)
        LEFT JOIN rota.key_limits l ON l.name = x.name
        WHERE l.id IS NULL
           OR (l.declared AND (l.concurrency_limit, l.rate_limit, l.rate_burst)
                              IS DISTINCT FROM (x.concurrency, x.rate,
                                                coalesce(x.burst, greatest(1, coalesce(x.rate, 1)))))
        ORDER BY x.name
    LOOP
        PERFORM rota.set_limit(d.name, d.concurrency, d.rate, d.burst, true, p_actor);
        RETURN NEXT d.name;
    END LOOP;
END
$$;

-- Removes a limit: its keys' tasks run unlimited, the parked ones back in
-- line at their places. Returns false for an unknown name.
CREATE OR REPLACE FUNCTION rota.drop_limit(p_name text, p_actor text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM rota.key_limits WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    -- Running rows first, then key rows: the order a release takes them in.
    UPDATE rota.running r SET key_id = NULL
    WHERE r.key_id = ANY (ARRAY(SELECT k.id FROM rota.keys k WHERE k.limit_id = v_id));
    PERFORM FROM rota.keys k WHERE k.limit_id = v_id ORDER BY k.id FOR UPDATE;
    WITH moved AS (
        DELETE FROM rota.parked p
        WHERE p.key_id = ANY (ARRAY(SELECT k.id FROM rota.keys k WHERE k.limit_id = v_id))
        RETURNING p.*
    )
    INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id, priority)
    SELECT m.queue_id, m.vtime, m.tenant_id, m.seq, m.task_id, m.priority FROM moved m;
    DELETE FROM rota.keys k WHERE k.limit_id = v_id;
    IF NOT EXISTS (SELECT FROM rota.key_limits) THEN
        UPDATE rota.queues SET key_limited = false WHERE key_limited;
    END IF;
    INSERT INTO rota.audit (actor, action, target, count)
    VALUES (p_actor, 'drop limit', 'limit:' || p_name, 1);
    PERFORM pg_notify('rota_ready', q.name) FROM rota.queues q;
    RETURN true;
END
$$;
