-- Rows in databases made by earlier versions (rota_tools.migration_fixtures),
-- made through those versions' own functions (the same from 0030 to 0047).
-- Named statements (`-- name: NAME`), found by rota_tools.sql.query(NAME).

-- name: fixture_rows
-- A tenant with limits and one without; tasks waiting, scheduled, running,
-- succeeded and dead, claimed and reported by a registered worker.
SELECT rota.configure_tenant('acme', 2, 5, 100, 10, 1000);
SELECT rota.name_ids(ARRAY['default'], ARRAY['acme', 'globex']);
INSERT INTO rota.tasks (id, queue_id, tenant_id, tenant, name, payload, status, eta)
SELECT x.id::uuid, q.id, t.id, t.name, 'jobs.add', '{"args": [1, 2], "kwargs": {}}',
       x.status::rota.task_status, x.eta::timestamptz
FROM (VALUES ('0193a000-0000-7000-8000-000000000001', 'acme', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000002', 'acme', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000003', 'globex', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000004', 'globex', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000005', 'acme', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000006', 'globex', 'scheduled',
              '2199-01-01 00:00:00+00')) x(id, tenant, status, eta)
JOIN rota.queues q ON q.name = 'default'
JOIN rota.tenants t ON t.name = x.tenant;
SELECT rota.register_worker('fixture-worker', 'fixture-host', 1, ARRAY['default'], 4,
                            'fixture-secret', 3600);
CREATE TEMP TABLE claimed AS
SELECT c.id, c.attempt, row_number() OVER (ORDER BY c.id) AS n
FROM rota.worker_claim('fixture-worker', 'fixture-secret', ARRAY['default'], 3, 1e9) c;
SELECT rota.worker_complete('fixture-worker', 'fixture-secret',
                            ARRAY(SELECT id FROM claimed WHERE n = 1),
                            ARRAY(SELECT attempt FROM claimed WHERE n = 1));
SELECT rota.worker_fail('fixture-worker', 'fixture-secret',
                        ARRAY(SELECT id FROM claimed WHERE n = 2),
                        ARRAY(SELECT attempt FROM claimed WHERE n = 2),
                        ARRAY['ValueError: boom'], ARRAY[NULL::timestamptz], ARRAY[true],
                        ARRAY['Traceback (most recent call last): ValueError: boom']);
DROP TABLE claimed

-- name: fixture_result_and_join
-- A kept result (0037), and a join waiting for its member (0039): the join's
-- task waits at rota.workflow.WAITING_AT until its member succeeds.
SELECT rota.name_ids(ARRAY['kept', 'flows'], ARRAY['acme']);
INSERT INTO rota.tasks (id, queue_id, tenant_id, tenant, name, payload, status, eta)
SELECT x.id::uuid, q.id, t.id, t.name, x.name, '{"args": [], "kwargs": {}}',
       x.status::rota.task_status, x.eta::timestamptz
FROM (VALUES ('0193a000-0000-7000-8000-000000000011', 'kept', 'jobs.total', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000021', 'flows', 'jobs.part', 'pending', NULL),
             ('0193a000-0000-7000-8000-000000000022', 'flows', 'jobs.gather', 'scheduled',
              '2199-12-31 00:00:00+00')) x(id, queue, name, status, eta)
JOIN rota.queues q ON q.name = x.queue
JOIN rota.tenants t ON t.name = 'acme';
SELECT rota.add_workflow(ARRAY['0193a000-0000-7000-8000-000000000022'::uuid], ARRAY['list'],
                         ARRAY['{"args": [], "kwargs": {}}'::json],
                         ARRAY['0193a000-0000-7000-8000-000000000021'::uuid],
                         ARRAY['0193a000-0000-7000-8000-000000000022'::uuid], ARRAY[0], 'acme',
                         '2199-12-31 00:00:00+00');
SELECT rota.worker_complete_keeping('fixture-worker', 'fixture-secret', ARRAY[c.id],
                                    ARRAY[c.attempt], ARRAY['{"total": 3}'::jsonb],
                                    ARRAY[NULL::text], ARRAY[1e9::double precision])
FROM rota.worker_claim('fixture-worker', 'fixture-secret', ARRAY['kept'], 1, 1e9) c
