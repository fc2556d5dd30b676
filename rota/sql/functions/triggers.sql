-- Triggers on rota.tasks, made after their functions. A file of their own:
-- making one again locks the table against writes until its transaction ends,
-- and a change to a function's text does not make them again.

-- Every insert of tasks (a load, a producer's fallback) puts them in line.
CREATE OR REPLACE TRIGGER enter_line AFTER INSERT ON rota.tasks
    REFERENCING NEW TABLE AS loaded
    FOR EACH STATEMENT EXECUTE FUNCTION rota.tasks_enter_line();

-- Workflows: a member's death or cancel, and its retry, reach its join.
CREATE OR REPLACE TRIGGER member_ended AFTER UPDATE OF status ON rota.tasks
    FOR EACH ROW
    WHEN (NEW.status IN ('dead', 'cancelled') AND OLD.status NOT IN ('dead', 'cancelled'))
    EXECUTE FUNCTION rota.member_ended();

CREATE OR REPLACE TRIGGER member_revived AFTER UPDATE OF status ON rota.tasks
    FOR EACH ROW
    WHEN (OLD.status IN ('dead', 'cancelled') AND NEW.status NOT IN ('dead', 'cancelled'))
    EXECUTE FUNCTION rota.member_revived();
