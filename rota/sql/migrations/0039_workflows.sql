CREATE TABLE rota.joins (
    task_id uuid PRIMARY KEY,
    members integer NOT NULL CONSTRAINT members_positive CHECK (members > 0),
    waiting integer NOT NULL CONSTRAINT waiting_bounded CHECK (waiting BETWEEN 0 AND members),
    results text NOT NULL CONSTRAINT results_kind CHECK (results IN ('one', 'list')),
    payload json NOT NULL,
    failed_member uuid,
    released boolean NOT NULL DEFAULT false
) WITH (
    fillfactor = 50
);
CREATE INDEX joins_waiting ON rota.joins (task_id) WHERE NOT released;

CREATE TABLE rota.members (
    task_id uuid PRIMARY KEY,  -- a task has one join at most: a graph is a tree
    join_id uuid NOT NULL REFERENCES rota.joins (task_id) ON DELETE CASCADE,
    position integer NOT NULL  -- its result's place among the join's members
);
CREATE INDEX members_of_join ON rota.members (join_id, position);
