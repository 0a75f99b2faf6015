-- Ambiguous commits (a COMMIT that succeeded while the client saw the
-- connection die) are retried; the retry must change nothing.
--
-- A step has at most one wait: its identity is (run_id, step_id), so a
-- repeated commit of a wait or an invoke inserts nothing (ON CONFLICT DO
-- NOTHING). Rows duplicated before this migration are merged first. The
-- unique index also serves lookups by run, so waits_by_run goes.
DELETE FROM waits WHERE id NOT IN (SELECT MIN(id) FROM waits GROUP BY run_id, step_id);
DROP INDEX waits_by_run;
CREATE UNIQUE INDEX waits_by_step ON waits (run_id, step_id);

-- The invocation (its fence token) whose park or end last wrote the run: a
-- retried park or end that finds its lease gone reads it to tell "my first
-- attempt committed" from "another worker took the run".
ALTER TABLE runs ADD COLUMN written_by TEXT;
