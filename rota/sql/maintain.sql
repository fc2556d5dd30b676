-- The maintenance duties (rota.consumer.maintenance).
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: promote_due
-- Due scheduled tasks (ETA reached, backoff over) into line at fair places.
SELECT rota.promote_due(%(limit)s::integer)

-- name: requeue_expired
SELECT id FROM rota.requeue_expired() AS id

-- name: reap_stopped_claims
-- Requeues claims still held by workers stopped that long ago.
SELECT task_id FROM rota.reap_stopped_claims(make_interval(secs => %(seconds)s)) AS task_id

-- name: live_workers
SELECT id, host, pid, extract(epoch FROM now() - heartbeat_at) AS silent_seconds
FROM rota.workers WHERE stopped_at IS NULL

-- name: reap_workers
-- Declares silent workers dead; the ids of their tasks requeued (those whose
-- leases passed).
SELECT task_id FROM rota.reap_workers(%(ids)b::text[]) AS task_id

-- name: reap_gone_workers
-- Declares dead the workers whose process is gone; the ids of all their
-- tasks, requeued.
SELECT task_id FROM rota.reap_gone_workers(%(ids)b::text[]) AS task_id

-- name: queue_names
SELECT name FROM rota.queues ORDER BY name

-- name: maintenance_lock
-- One elected runner of the maintenance duties (session lock, held while alive).
SELECT pg_try_advisory_lock(hashtext('rota.maintenance'))

-- name: prune_finished
SELECT rota.prune_finished(make_interval(secs => %(seconds)s), %(limit)s::integer)

-- name: prune_dead
SELECT rota.prune_dead(make_interval(secs => %(seconds)s), %(limit)s::integer)

-- name: prune_workers
SELECT rota.prune_workers(make_interval(secs => %(seconds)s))

-- name: prune_loader_batches
SELECT rota.prune_loader_batches(make_interval(secs => %(seconds)s), %(keep)s::integer)

-- name: count_service
-- At the transaction's time, unless a clock is given (`at`).
SELECT rota.count_service(coalesce(%(at)s::timestamptz, now()))

-- name: refresh_stats
-- At the transaction's time, unless a clock is given (`at`).
SELECT rota.refresh_stats(coalesce(%(at)s::timestamptz, now()))

-- name: archived_before
-- Everything that ended before this is archived (`rota archive`); NULL: nothing is.
SELECT max(before) FROM rota.archives

-- name: prune_results
SELECT rota.prune_results(%(limit)s::integer)
