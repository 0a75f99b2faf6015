-- index dedupe_by_expiry
CREATE INDEX dedupe_by_expiry ON dedupe (expires_at);

-- index events_by_id
CREATE INDEX events_by_id ON events (id);

-- index events_by_received
CREATE INDEX events_by_received ON events (received_at);

-- index jobs_by_status
CREATE INDEX jobs_by_status ON jobs (status, updated_at);

-- index queue_by_due
CREATE INDEX queue_by_due ON queue (available_at);

-- index queue_by_owner
CREATE INDEX queue_by_owner ON queue (owner);

-- index run_events_by_event
CREATE INDEX run_events_by_event ON run_events (event_seq);

-- index runs_by_created
CREATE INDEX runs_by_created ON runs (created_at, id);

-- index runs_by_function
CREATE INDEX runs_by_function ON runs (function_id, created_at);

-- index runs_by_status
CREATE INDEX runs_by_status ON runs (status, created_at);

-- index spans_by_run
CREATE INDEX spans_by_run ON spans (run_id, id);

-- table dedupe
CREATE TABLE dedupe (
    key         TEXT PRIMARY KEY,
    ref         TEXT NOT NULL,
    expires_at  REAL NOT NULL
);

-- table events
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL,
    name         TEXT NOT NULL,
    data         TEXT NOT NULL,
    ts           INTEGER NOT NULL,
    received_at  REAL NOT NULL
);

-- table functions
CREATE TABLE functions (
    id          TEXT PRIMARY KEY,
    app         TEXT NOT NULL,
    config      TEXT NOT NULL,
    updated_at  REAL NOT NULL
);

-- table jobs
CREATE TABLE jobs (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    status       TEXT NOT NULL,
    params       TEXT NOT NULL,
    done         INTEGER NOT NULL DEFAULT 0,
    examined     INTEGER NOT NULL DEFAULT 0,
    error        TEXT,
    owner        TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    finished_at  REAL
);

-- table queue
CREATE TABLE queue (
    run_id            TEXT PRIMARY KEY,
    function_id       TEXT NOT NULL,
    partition_key     TEXT NOT NULL DEFAULT '',
    available_at      REAL,
    sort_at           REAL NOT NULL,
    owner             TEXT,
    epoch             INTEGER NOT NULL DEFAULT 0,
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    start_deadline    REAL
);

-- table run_events
CREATE TABLE run_events (
    run_id     TEXT NOT NULL,
    position   INTEGER NOT NULL,
    event_seq  INTEGER NOT NULL,
    PRIMARY KEY (run_id, position)
);

-- table runs
CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    function_id     TEXT NOT NULL,
    status          TEXT NOT NULL,
    event_ids       TEXT NOT NULL,
    output          TEXT,
    error           TEXT,
    created_at      REAL NOT NULL,
    started_at      REAL,
    ended_at        REAL,
    attempt         INTEGER NOT NULL DEFAULT 0,
    epoch           INTEGER NOT NULL DEFAULT 0,
    app_version     TEXT,
    parent_run_id   TEXT,
    parent_step_id  TEXT,
    idempotency_key TEXT,
    meta            TEXT
);

-- table schema_migrations
CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);

-- table spans
CREATE TABLE spans (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 0,
    started_at  REAL NOT NULL,
    ended_at    REAL,
    status      TEXT NOT NULL,
    error       TEXT,
    detail      TEXT
);

-- table steps
CREATE TABLE steps (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    position    INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    output      TEXT,
    error       TEXT,
    wake_at     REAL,
    started_at  REAL,
    ended_at    REAL,
    PRIMARY KEY (run_id, step_id)
);

-- table workers
CREATE TABLE workers (
    id            TEXT PRIMARY KEY,
    app           TEXT NOT NULL,
    app_version   TEXT,
    concurrency   INTEGER NOT NULL,
    started_at    REAL NOT NULL,
    heartbeat_at  REAL NOT NULL,
    functions     TEXT NOT NULL
);
