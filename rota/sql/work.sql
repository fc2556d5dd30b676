-- Workers: claim, report, heartbeat.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: listen_ready
-- Loads, requeues and promotions notify this channel once per queue and batch.
LISTEN rota_ready

-- name: claim
-- Claims up to `limit` ready tasks of the given queues in fair order (SKIP
-- LOCKED), limits enforced; the statement is rota.claim's (functions/claim.sql).
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at
FROM rota.claim(%(queues)b::text[], %(limit)s::integer, %(worker)s::text,
                %(lease_seconds)s::float8)

-- name: complete
SELECT id FROM rota.complete(%(ids)b::uuid[], %(attempts)b::integer[], %(started)b::float8[],
                             %(ran)b::float8[]) AS id

-- name: complete_claim
-- A report of completions and the next claim in one statement: its first row
-- is the outcome (completed, claimed), the claimed tasks follow.
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at,
       completed, claimed
FROM rota.complete_claim(%(ids)b::uuid[], %(attempts)b::integer[], %(queues)b::text[],
                         %(limit)s::integer, %(worker)s::text, %(lease_seconds)s::float8,
                         %(started)b::float8[], %(ran)b::float8[])

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
                                  %(lease_seconds)s::float8, %(started)b::float8[]) AS id

-- name: register_worker
-- With a secret (a worker's key), only its hash is kept.
SELECT rota.register_worker(%(id)s::text, %(host)s::text, %(pid)s::integer, %(queues)s::text[],
                            %(concurrency)s::integer, %(secret)s::bytea,
                            %(heartbeat_seconds)s::float8)

-- name: worker_heartbeat
SELECT rota.worker_heartbeat(%(id)s::text)

-- name: stop_worker
SELECT rota.stop_worker(%(id)s::text)

-- As a worker (rota.core.WorkerKey): each checks the worker's secret first
-- (rota.check_worker), then claims or reports for that worker's tasks only.

-- name: worker_claim
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at
FROM rota.worker_claim(%(worker)s::text, %(secret)s::bytea, %(queues)b::text[],
                       %(limit)s::integer, %(lease_seconds)s::float8)

-- name: worker_complete
SELECT id FROM rota.worker_complete(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                                    %(attempts)b::integer[], %(started)b::float8[],
                                    %(ran)b::float8[]) AS id

-- name: worker_complete_claim
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at,
       completed, claimed
FROM rota.worker_complete_claim(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                                %(attempts)b::integer[], %(queues)b::text[], %(limit)s::integer,
                                %(lease_seconds)s::float8, %(started)b::float8[],
                                %(ran)b::float8[])

-- name: worker_fail
SELECT id, status::text, run_at
FROM rota.worker_fail(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                      %(attempts)b::integer[], %(errors)b::text[], %(retry_at)b::timestamptz[],
                      %(final)b::boolean[], %(tracebacks)b::text[])

-- name: worker_release
SELECT id FROM rota.worker_release(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                                   %(attempts)b::integer[]) AS id

-- name: worker_defer_unknown
SELECT id, status::text
FROM rota.worker_defer_unknown(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                               %(attempts)b::integer[], %(delay)s, %(grace)s, %(reason)s)

-- name: worker_extend_leases
SELECT id FROM rota.worker_extend_leases(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                                         %(attempts)b::integer[],
                                         %(lease_seconds)s::float8, %(started)b::float8[]) AS id

-- name: worker_claims_held
SELECT task_id, attempt FROM rota.worker_claims(%(worker)s::text, %(secret)s::bytea)

-- name: worker_beat
SELECT rota.worker_beat(%(worker)s::text, %(secret)s::bytea)

-- name: worker_rejoin
SELECT rota.worker_rejoin(%(worker)s::text, %(secret)s::bytea)

-- name: worker_stop
SELECT rota.worker_stop(%(worker)s::text, %(secret)s::bytea)

-- name: complete_keeping
SELECT task_id AS id
FROM rota.complete_keeping(%(ids)b::uuid[], %(attempts)b::integer[], %(values)s::jsonb[],
                           %(refused)s::text[], %(ttls)s::double precision[],
                           %(started)b::float8[], %(ran)b::float8[])

-- name: worker_complete_keeping
SELECT id FROM rota.worker_complete_keeping(%(worker)s::text, %(secret)s::bytea,
                                            %(ids)b::uuid[], %(attempts)b::integer[],
                                            %(values)s::jsonb[], %(refused)s::text[],
                                            %(ttls)s::double precision[], %(started)b::float8[],
                                            %(ran)b::float8[]) AS id

-- name: wake_result_waiters
SELECT rota.wake_result_waiters(%(ids)b::uuid[])

-- name: report_progress
-- The latest progress of tasks in flight, one flush for all (at most about
-- once a second): returns the ids whose values were stored.
SELECT id FROM rota.report_progress(%(ids)b::uuid[], %(attempts)b::integer[],
                                    %(done)b::float8[], %(totals)s::float8[],
                                    %(messages)s::text[]) AS id

-- name: worker_report_progress
SELECT id FROM rota.worker_report_progress(%(worker)s::text, %(secret)s::bytea,
                                           %(ids)b::uuid[], %(attempts)b::integer[],
                                           %(done)b::float8[], %(totals)s::float8[],
                                           %(messages)s::text[]) AS id

-- name: listen_cancel
-- "worker task" when a task that worker runs is cancelled.
LISTEN rota_cancel

-- name: complete_keeping_claim
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at,
       completed, claimed
FROM rota.complete_keeping_claim(%(ids)b::uuid[], %(attempts)b::integer[], %(values)s::jsonb[],
                                 %(refused)s::text[], %(ttls)s::double precision[],
                                 %(queues)b::text[], %(limit)s::integer, %(worker)s::text,
                                 %(lease_seconds)s::float8, %(started)b::float8[],
                                 %(ran)b::float8[])

-- name: worker_complete_keeping_claim
SELECT id, name, payload, queue, tenant, attempt, max_attempts, lease_expires_at, enqueued_at,
       completed, claimed
FROM rota.worker_complete_keeping_claim(%(worker)s::text, %(secret)s::bytea, %(ids)b::uuid[],
                                        %(attempts)b::integer[], %(values)s::jsonb[],
                                        %(refused)s::text[], %(ttls)s::double precision[],
                                        %(queues)b::text[], %(limit)s::integer,
                                        %(lease_seconds)s::float8, %(started)b::float8[],
                                        %(ran)b::float8[])

-- name: record_run_times
-- Runs and their seconds per queue and tenant since the last heartbeat.
SELECT rota.record_run_times(%(queues)s::text[], %(tenants)s::text[], %(runs)s::integer[],
                             %(seconds)s::double precision[])

-- name: declare_limits
-- The limits on keys that a worker's app declares (rota.Limit with numbers),
-- at its start; returns the names it set (new or changed).
SELECT rota.declare_limits(%(names)s::text[], %(concurrency)s::integer[], %(rates)s::float8[],
                           %(bursts)s::float8[], %(actor)s::text)
