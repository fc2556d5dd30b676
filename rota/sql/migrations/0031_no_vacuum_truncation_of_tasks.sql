-- rota 0031: rota.tasks keeps its emptied pages too (0010 did so for ready,
-- running and scheduled). Completed tasks leave it, so it empties whenever the
-- fleet catches up, and autovacuum then truncated it under an ACCESS
-- EXCLUSIVE lock: every load and claim, which read or write the table, waited
-- until the truncation gave the lock back (tens of milliseconds at a time).
ALTER TABLE rota.tasks SET (vacuum_truncate = false);
