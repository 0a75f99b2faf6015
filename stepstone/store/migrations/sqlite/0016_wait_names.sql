-- A wait on several event names (wait_for_event(event=[...])) has one row per
-- name, each indexed under its name; the first event that resolves the wait
-- deletes every row of its step in one statement (the delete decides a race).
DROP INDEX waits_by_step;
CREATE UNIQUE INDEX waits_by_step ON waits (run_id, step_id, event_name);
-- wait_for_event(lookback=): the events of a name committed in a time window.
CREATE INDEX events_by_name ON events (name, received_at);
