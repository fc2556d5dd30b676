-- Autovacuum truncates empty pages off the end of a table under an ACCESS
-- EXCLUSIVE lock. The queue tables empty and refill all the time (rota.running
-- does every time the fleet catches up), so it kept asking for that lock: while
-- a strong lock is asked for, every claim's and completion's lock on the table
-- leaves the lock manager's fast path for its shared, LWLock-guarded table
-- (`rota bench lock-pressure` shows it). Standbys also replay that lock against their readers. The
-- pages are reused anyway, as the tables refill.
ALTER TABLE rota.ready SET (vacuum_truncate = false);
ALTER TABLE rota.running SET (vacuum_truncate = false);
ALTER TABLE rota.scheduled SET (vacuum_truncate = false);
