-- Signals sent to a run (app.runs.signal), buffered until a wait_for_signal
-- step of the run with their name consumes them, oldest first (seq). A signal
-- is consumed exactly once: consumed_by names the step that received it, set
-- in the transaction that completes that step's memo.
CREATE TABLE signals (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    run_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    data         TEXT NOT NULL,
    sent_at      REAL NOT NULL,
    consumed_by  TEXT,
    consumed_at  REAL
);
CREATE INDEX signals_by_run ON signals (run_id, name, seq);
