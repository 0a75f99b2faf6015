-- Orchestration: waits (events, cancellations, invoked children), cron
-- schedules, timeouts and wake-up requests.

ALTER TABLE queue ADD COLUMN wake_requested INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN finish_timeout REAL;
ALTER TABLE queue ADD COLUMN finish_deadline REAL;
CREATE INDEX queue_by_start_deadline ON queue (start_deadline);
CREATE INDEX queue_by_finish_deadline ON queue (finish_deadline);

ALTER TABLE runs ADD COLUMN singleton_key TEXT;

-- A run waiting for something: an event (kind 'event', 'cancel') or a child
-- run (kind 'invoke', match_value = the child's run id). Deleting the row is
-- what resolves it, so an event and a timeout can never both win.
CREATE TABLE waits (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL,
    step_id      TEXT NOT NULL,
    kind         TEXT NOT NULL,
    event_name   TEXT NOT NULL,
    match_key    TEXT NOT NULL DEFAULT '',
    match_value  TEXT NOT NULL DEFAULT '',
    expression   TEXT,
    event_json   TEXT,
    created_at   REAL NOT NULL,
    expires_at   REAL
);
CREATE INDEX waits_by_match ON waits (event_name, match_key, match_value);
CREATE INDEX waits_by_run ON waits (run_id);

-- Which match keys are in use per event name (so matching an event costs one
-- indexed probe per key, whatever the number of waiting runs).
CREATE TABLE wait_keys (
    event_name  TEXT NOT NULL,
    match_key   TEXT NOT NULL,
    PRIMARY KEY (event_name, match_key)
);

CREATE TABLE crons (
    function_id  TEXT NOT NULL,
    schedule     TEXT NOT NULL,
    next_at      REAL NOT NULL,
    PRIMARY KEY (function_id, schedule)
);
