-- rota 0029: rota.vclock and rota.lock_queues in plpgsql, whose plans are kept
-- for the session: as sql functions that cannot be inlined (a definer, a
-- row lock) they planned their statement on every call, 40 and 25 us of
-- every load.

CREATE OR REPLACE FUNCTION rota.vclock(p_queue_id integer) RETURNS double precision
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN coalesce(
        (SELECT r.vtime FROM rota.ready r WHERE r.queue_id = p_queue_id ORDER BY r.vtime LIMIT 1),
        (SELECT q.max_start FROM rota.queues q WHERE q.id = p_queue_id),
        0);
END
$$;

CREATE OR REPLACE FUNCTION rota.lock_queues(p_queue_ids integer[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM rota.queues WHERE id = ANY(p_queue_ids) ORDER BY id FOR UPDATE;
END
$$;
