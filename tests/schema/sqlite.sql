-- index apps_by_app
CREATE UNIQUE INDEX apps_by_app ON apps (app);

-- index batches_by_run
CREATE INDEX batches_by_run ON batches (run_id);

-- index debounces_by_run
CREATE INDEX debounces_by_run ON debounces (run_id);

-- index dedupe_by_expiry
CREATE INDEX dedupe_by_expiry ON dedupe (expires_at);

-- index events_by_id
CREATE INDEX events_by_id ON events (id);

-- index events_by_name
CREATE INDEX events_by_name ON events (name, received_at);

-- index events_by_received
CREATE INDEX events_by_received ON events (received_at);

-- index jobs_by_status
CREATE INDEX jobs_by_status ON jobs (status, updated_at);

-- index partitions_by_ckey
CREATE INDEX partitions_by_ckey ON partitions (ckey) WHERE ckey IS NOT NULL;

-- index partitions_by_next
CREATE INDEX partitions_by_next ON partitions (next_at);

-- index queue_by_ckey1
CREATE INDEX queue_by_ckey1 ON queue (ckey1, owner) WHERE ckey1 IS NOT NULL;

-- index queue_by_ckey2
CREATE INDEX queue_by_ckey2 ON queue (ckey2, owner) WHERE ckey2 IS NOT NULL;

-- index queue_by_finish_deadline
CREATE INDEX queue_by_finish_deadline ON queue (finish_deadline) WHERE finish_deadline IS NOT NULL;

-- index queue_by_owner
CREATE INDEX queue_by_owner ON queue (owner);

-- index queue_by_partition
CREATE INDEX queue_by_partition ON queue (partition_key, fresh, available_at);

-- index queue_by_partition_fresh
CREATE INDEX queue_by_partition_fresh ON queue (partition_key, sort_at, run_id) WHERE fresh = 1;

-- index queue_by_start_deadline
CREATE INDEX queue_by_start_deadline ON queue (start_deadline) WHERE start_deadline IS NOT NULL;

-- index run_events_by_event
CREATE INDEX run_events_by_event ON run_events (event_seq);

-- index runs_by_created
CREATE INDEX runs_by_created ON runs (created_at, id);

-- index runs_by_ended
CREATE INDEX runs_by_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;

-- index runs_by_function
CREATE INDEX runs_by_function ON runs (function_id, created_at);

-- index runs_by_status
CREATE INDEX runs_by_status ON runs (status, created_at);

-- index signals_by_run
CREATE INDEX signals_by_run ON signals (run_id, name, seq);

-- index spans_by_run
CREATE INDEX spans_by_run ON spans (run_id, id);

-- index waits_by_key_version
CREATE INDEX waits_by_key_version ON waits (event_name, key_version) WHERE match_key = '';

-- index waits_by_match
CREATE INDEX waits_by_match ON waits (event_name, match_key, match_value);

-- index waits_by_number
CREATE INDEX waits_by_number ON waits (event_name, match_key, match_number)
    WHERE match_number IS NOT NULL;

-- index waits_by_step
CREATE UNIQUE INDEX waits_by_step ON waits (run_id, step_id, event_name, part);

-- table apps
CREATE TABLE apps (
    url           TEXT PRIMARY KEY,
    app           TEXT NOT NULL,
    app_version   TEXT,
    max_duration  REAL NOT NULL,
    function_ids  TEXT NOT NULL,
    created_at    REAL NOT NULL,
    synced_at     REAL NOT NULL,
    error         TEXT,
    error_at      REAL
);

-- table batches
CREATE TABLE batches (
    key       TEXT PRIMARY KEY,
    run_id    TEXT NOT NULL,
    size      INTEGER NOT NULL,
    first_at  REAL NOT NULL
);

-- table crons
CREATE TABLE crons (
    function_id  TEXT NOT NULL,
    schedule     TEXT NOT NULL,
    next_at      REAL NOT NULL,
    PRIMARY KEY (function_id, schedule)
);

-- table debounces
CREATE TABLE debounces (
    key       TEXT PRIMARY KEY,
    run_id    TEXT NOT NULL,
    first_at  REAL NOT NULL
);

-- table dedupe
CREATE TABLE "dedupe" (
    key         TEXT PRIMARY KEY,
    ref         TEXT NOT NULL,
    expires_at  REAL NOT NULL
) WITHOUT ROWID;

-- table events
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL,
    name         TEXT NOT NULL,
    data         TEXT NOT NULL,
    ts           INTEGER NOT NULL,
    received_at  REAL NOT NULL
, trace TEXT);

-- table functions
CREATE TABLE functions (
    id          TEXT PRIMARY KEY,
    app         TEXT NOT NULL,
    config      TEXT NOT NULL,
    updated_at  REAL NOT NULL
, retired_at REAL);

-- table gcra
CREATE TABLE gcra (
    key  TEXT PRIMARY KEY,
    tat  REAL NOT NULL
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

-- table partitions
CREATE TABLE partitions (
    key          TEXT PRIMARY KEY,
    function_id  TEXT NOT NULL,
    ckey         TEXT,
    next_at      REAL,
    last_served  REAL NOT NULL DEFAULT 0
);

-- table queue
CREATE TABLE "queue" (
    run_id            TEXT PRIMARY KEY,
    function_id       TEXT NOT NULL,
    partition_key     TEXT NOT NULL DEFAULT '',
    available_at      REAL,
    sort_at           REAL NOT NULL,
    owner             TEXT,
    epoch             INTEGER NOT NULL DEFAULT 0,
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    start_deadline    REAL,
    wake_requested    INTEGER NOT NULL DEFAULT 0,
    finish_timeout    REAL,
    finish_deadline   REAL,
    ckey1             TEXT,
    limit1            INTEGER,
    ckey2             TEXT,
    limit2            INTEGER,
    throttle_key      TEXT,
    fresh             INTEGER NOT NULL DEFAULT 1 CHECK (fresh IN (0, 1)),
    cancel_reason     TEXT
) WITHOUT ROWID;

-- table run_events
CREATE TABLE "run_events" (
    run_id     TEXT NOT NULL,
    position   INTEGER NOT NULL,
    event_seq  INTEGER NOT NULL,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;

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
, singleton_key TEXT, queue_spec TEXT, written_by TEXT);

-- table schema_migrations
CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);

-- table signals
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
    ended_at    REAL, fingerprint TEXT,
    PRIMARY KEY (run_id, step_id)
);

-- table wait_keys
CREATE TABLE wait_keys (
    event_name  TEXT NOT NULL,
    match_key   TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0, born TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (event_name, match_key)
);

-- table waits
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
, part INTEGER NOT NULL DEFAULT 0, match_number REAL, key_version INTEGER);

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
