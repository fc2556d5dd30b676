-- A load moves its pairs' tags on in one UPDATE under their row locks
-- (rota.advance_tags), which replaces locking them (rota.lock_tags) and then
-- reading them (rota.fair_starts). Only rota's own placement called those,
-- and it is replaced in the same transaction.
DROP FUNCTION IF EXISTS rota.lock_tags(integer[], integer[]);
DROP FUNCTION IF EXISTS rota.fair_starts(integer[], integer[]);
