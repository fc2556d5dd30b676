-- Workers: claim, report, heartbeat.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: listen_ready
-- Loads, requeues and promotions notify this channel once per queue and batch.
LISTEN rota_ready

-- name: claim
-- Claims up to `limit` ready tasks of the given queues in fair order (SKIP
-- LOCKED), limits enforced; the statement is rota.claim's (schema.sql).
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at
FROM rota.claim(%(queues)b::text[], %(limit)s::integer, %(worker)s::text,
                %(lease_seconds)s::float8)

-- name: complete
SELECT id FROM rota.complete(%(ids)b::uuid[], %(attempts)b::integer[]) AS id

-- name: fail
SELECT id, status::text, run_at
FROM rota.fail(%(ids)b::uuid[], %(attempts)b::integer[], %(errors)b::text[],
               %(retry_at)b::timestamptz[], %(final)b::boolean[], %(tracebacks)b::text[])

-- name: defer_unknown
SELECT id, status::text
FROM rota.defer_unknown(%(ids)b::uuid[], %(attempts)b::integer[], %(delay)s, %(grace)s,
                        %(reason)s)

-- name: worker_claims
-- The tasks a worker holds (to find what a claim it could not read took).
SELECT task_id, attempt FROM rota.running WHERE worker = %(worker)s

-- name: requeue
SELECT id FROM rota.requeue(%(ids)b::uuid[], %(attempts)b::integer[], %(consume)s,
                            %(reason)s) AS id

-- name: extend_leases
-- Heartbeat: returns the ids whose lease this worker still holds.
SELECT id FROM rota.extend_leases(%(ids)b::uuid[], %(attempts)b::integer[],
                                  %(lease_seconds)s::float8) AS id

-- name: register_worker
INSERT INTO rota.workers (id, host, pid, queues, concurrency)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s)

-- name: worker_heartbeat
SELECT rota.worker_heartbeat(%(id)s::text)

-- name: stop_worker
SELECT rota.stop_worker(%(id)s::text)
