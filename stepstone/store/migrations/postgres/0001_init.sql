-- Stepstone schema, PostgreSQL dialect (mirrors sqlite/0001_init.sql). Times are
-- epoch seconds (DOUBLE PRECISION) supplied by the application; JSON values are TEXT.

CREATE TABLE functions (
    id          TEXT PRIMARY KEY,
    app         TEXT NOT NULL,
    config      TEXT NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);

CREATE TABLE events (
    seq          BIGSERIAL PRIMARY KEY,
    id           TEXT NOT NULL,
    name         TEXT NOT NULL,
    data         TEXT NOT NULL,
    ts           BIGINT NOT NULL,
    received_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX events_by_id ON events (id);
CREATE INDEX events_by_received ON events (received_at);

-- Keys claimed for a time: event ids, idempotency keys, cron ticks.
CREATE TABLE dedupe (
    key         TEXT PRIMARY KEY,
    ref         TEXT NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX dedupe_by_expiry ON dedupe (expires_at);

-- Run ids are ULIDs: "C" collation keeps their byte order (newest-first paging)
-- whatever the database's locale.
CREATE TABLE runs (
    id              TEXT COLLATE "C" PRIMARY KEY,
    function_id     TEXT NOT NULL,
    status          TEXT NOT NULL,
    event_ids       TEXT NOT NULL,
    output          TEXT,
    error           TEXT,
    created_at      DOUBLE PRECISION NOT NULL,
    started_at      DOUBLE PRECISION,
    ended_at        DOUBLE PRECISION,
    attempt         BIGINT NOT NULL DEFAULT 0,
    epoch           BIGINT NOT NULL DEFAULT 0,
    app_version     TEXT,
    parent_run_id   TEXT,
    parent_step_id  TEXT,
    idempotency_key TEXT,
    meta            TEXT
);
CREATE INDEX runs_by_created ON runs (created_at, id);
CREATE INDEX runs_by_function ON runs (function_id, created_at);
CREATE INDEX runs_by_status ON runs (status, created_at);

CREATE TABLE run_events (
    run_id     TEXT NOT NULL,
    position   BIGINT NOT NULL,
    event_seq  BIGINT NOT NULL,
    PRIMARY KEY (run_id, position)
);
CREATE INDEX run_events_by_event ON run_events (event_seq);

-- One item per run that is not over: due at available_at (while leased, the
-- lease expiry), ordered by sort_at (available_at moved by priority).
CREATE TABLE queue (
    run_id            TEXT PRIMARY KEY,
    function_id       TEXT NOT NULL,
    partition_key     TEXT NOT NULL DEFAULT '',
    available_at      DOUBLE PRECISION,
    sort_at           DOUBLE PRECISION NOT NULL,
    owner             TEXT,
    epoch             BIGINT NOT NULL DEFAULT 0,
    cancel_requested  BIGINT NOT NULL DEFAULT 0,
    start_deadline    DOUBLE PRECISION
);
CREATE INDEX queue_by_due ON queue (available_at);
CREATE INDEX queue_by_owner ON queue (owner);

-- Step memos: the latest state of each step of a run.
CREATE TABLE steps (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    position    BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempts    BIGINT NOT NULL DEFAULT 0,
    output      TEXT,
    error       TEXT,
    wake_at     DOUBLE PRECISION,
    started_at  DOUBLE PRECISION,
    ended_at    DOUBLE PRECISION,
    PRIMARY KEY (run_id, step_id)
);

-- The trace: every step attempt, sleep, wait and warning of a run.
CREATE TABLE spans (
    id          BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    attempt     BIGINT NOT NULL DEFAULT 0,
    started_at  DOUBLE PRECISION NOT NULL,
    ended_at    DOUBLE PRECISION,
    status      TEXT NOT NULL,
    error       TEXT,
    detail      TEXT
);
CREATE INDEX spans_by_run ON spans (run_id, id);

CREATE TABLE workers (
    id            TEXT PRIMARY KEY,
    app           TEXT NOT NULL,
    app_version   TEXT,
    concurrency   BIGINT NOT NULL,
    started_at    DOUBLE PRECISION NOT NULL,
    heartbeat_at  DOUBLE PRECISION NOT NULL,
    functions     TEXT NOT NULL
);
