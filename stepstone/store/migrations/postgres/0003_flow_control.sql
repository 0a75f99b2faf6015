-- PostgreSQL dialect of sqlite/0003_flow_control.sql (same statements, PostgreSQL types).
-- Flow control: concurrency keys, partitions for fair scheduling, GCRA state
-- (throttle, rate limit), debounce and batch accumulators.

ALTER TABLE queue ADD COLUMN ckey1 TEXT;
ALTER TABLE queue ADD COLUMN limit1 BIGINT;
ALTER TABLE queue ADD COLUMN ckey2 TEXT;
ALTER TABLE queue ADD COLUMN limit2 BIGINT;
ALTER TABLE queue ADD COLUMN throttle_key TEXT;
ALTER TABLE queue ADD COLUMN fresh BIGINT NOT NULL DEFAULT 1;
CREATE INDEX queue_by_partition ON queue (partition_key, available_at);
CREATE INDEX queue_by_ckey1 ON queue (ckey1, owner) WHERE ckey1 IS NOT NULL;
CREATE INDEX queue_by_ckey2 ON queue (ckey2, owner) WHERE ckey2 IS NOT NULL;

-- A partition is a function plus its first concurrency key value. next_at is
-- a hint that may be early, never late: every write that makes an item due
-- sooner lowers it; leasing recomputes it.
CREATE TABLE partitions (
    key          TEXT PRIMARY KEY,
    function_id  TEXT NOT NULL,
    ckey         TEXT,
    next_at      DOUBLE PRECISION,
    last_served  DOUBLE PRECISION NOT NULL DEFAULT 0
);
CREATE INDEX partitions_by_next ON partitions (next_at);
CREATE INDEX partitions_by_ckey ON partitions (ckey);

UPDATE queue SET partition_key = function_id WHERE partition_key = '';
INSERT INTO partitions (key, function_id, next_at)
    SELECT partition_key, function_id, MIN(available_at) FROM queue GROUP BY partition_key, function_id;

-- Generic cell rate algorithm: the theoretical arrival time per key.
CREATE TABLE gcra (
    key  TEXT PRIMARY KEY,
    tat  DOUBLE PRECISION NOT NULL
);

CREATE TABLE debounces (
    key       TEXT PRIMARY KEY,
    run_id    TEXT NOT NULL,
    first_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX debounces_by_run ON debounces (run_id);

CREATE TABLE batches (
    key       TEXT PRIMARY KEY,
    run_id    TEXT NOT NULL,
    size      BIGINT NOT NULL,
    first_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX batches_by_run ON batches (run_id);
ALTER TABLE runs ADD COLUMN queue_spec TEXT;
