-- More condition shapes are indexed (runtime/waits.py, expressions.index_shape):
--  * a wait whose run holds a list (async.data.X in event.data.Y) or a string
--    whose prefixes an incoming value may be (event.data.Y.startsWith(...)) has
--    one row per element or prefix: part 0 is the wait, parts 1.. only index it
--    (a step's rows are claimed, and deleted, together);
--  * a comparison (<, <=, >, >=) stores the waiting run's number in
--    match_number, and an incoming event reads the range its value allows.
ALTER TABLE waits ADD COLUMN part INTEGER NOT NULL DEFAULT 0;
ALTER TABLE waits ADD COLUMN match_number REAL;
DROP INDEX waits_by_step;
CREATE UNIQUE INDEX waits_by_step ON waits (run_id, step_id, event_name, part);
CREATE INDEX waits_by_number ON waits (event_name, match_key, match_number)
    WHERE match_number IS NOT NULL;
