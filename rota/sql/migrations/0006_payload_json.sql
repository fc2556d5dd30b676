-- rota 0006: task payloads stored as json (validated text), not jsonb. rota
-- never looks inside a payload: it stores what the producer wrote and hands
-- it back to the worker, so parsing it into jsonb on load (and printing it
-- back on claim) was pure cost.
-- json also holds strings with U+0000, which jsonb refused at load time.

ALTER TABLE rota.tasks ALTER COLUMN payload TYPE json USING payload::json;
