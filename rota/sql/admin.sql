-- Operators' actions.
-- Named statements (`-- name: NAME`), found by rota.sql.query(NAME).
-- Array parameters are sent in binary (`%(name)b`): the text form quotes each element.

-- name: configure_tenant
SELECT rota.configure_tenant(%(name)s, %(weight)s, %(concurrency_limit)s, %(rate_limit)s,
                             %(rate_burst)s, %(capacity)s)
