-- More condition shapes are indexed (runtime/waits.py, expressions.index_shape):
--  * a wait whose run holds a list (async.data.X in event.data.Y) or a string
--    whose prefixes an incoming value may be (event.data.Y.startsWith(...)) has
--    one row per element or prefix: part 0 is the wait, parts 1.. only index it
--    (a step's rows are claimed, and deleted, together);
--  * a comparison (<, <=, >, >=) stores the waiting run's number in
--    match_number, and an incoming event reads the range its value allows.
ALTER TABLE waits ADD COLUMN part INTEGER NOT NULL DEFAULT 0;
ALTER TABLE waits ADD COLUMN match_number DOUBLE PRECISION;
DROP INDEX waits_by_step;
CREATE UNIQUE INDEX waits_by_step ON waits (run_id, step_id, event_name, part);
CREATE INDEX waits_by_number ON waits (event_name, match_key, match_number)
    WHERE match_number IS NOT NULL;
-- What remains unindexed (match_key '') may be evaluated before a send's write
-- transaction (runtime/waits.py, survey): each key row counts the waits that
-- took it (version, bumped under the row's lock, so in commit order) and
-- names its incarnation (born: retention may delete and a wait re-create it);
-- a wait keeps the count it took (key_version), so the write transaction
-- reads only the waits committed since the survey.
ALTER TABLE wait_keys ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE wait_keys ADD COLUMN born TEXT NOT NULL DEFAULT '';
ALTER TABLE waits ADD COLUMN key_version BIGINT;
CREATE INDEX waits_by_key_version ON waits (event_name, key_version) WHERE match_key = '';
