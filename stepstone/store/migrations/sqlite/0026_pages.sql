-- Fewer index pages per run (issue 18, session 10): a commit writes one page
-- per B-tree its rows touch, and a sequential run's commits are mostly those.
--  * The deadline indexes hold only the items that have a deadline (most runs
--    have no timeout): an item without one is in neither. The timeout scan
--    (start_deadline <= :now OR finish_deadline <= :now) and next_deadline
--    (MIN(...) WHERE ... IS NOT NULL) still read them.
--  * queue_by_due goes: its one reader (run_backlog, the metrics endpoint)
--    reads each partition's due items through queue_by_partition instead.
--  * queue_by_partition is (partition_key, fresh, available_at) and
--    queue_by_partition_resumed goes: an item leased before (fresh = 0: a
--    running, sleeping or waiting run) is in one index by partition, not two.
--    A lease pass's resumed runs, by due time, are a range of it; a
--    partition's earliest time is a seek per value of fresh, which the
--    queue's check keeps to 0 (taken before) or 1 (never taken).
--  * partitions_by_ckey holds only the partitions of a concurrency key (its
--    one reader, wake_ckey, looks a key up). On PostgreSQL an update of a
--    partition's next_at (two a send) writes an entry in each of its indexes.
DROP INDEX partitions_by_ckey;
CREATE INDEX partitions_by_ckey ON partitions (ckey) WHERE ckey IS NOT NULL;
-- SQLite: a table keyed by TEXT is two B-trees, its rows and its key's index,
-- so every row written is two pages. queue, dedupe and run_events (small rows,
-- found by their key) become WITHOUT ROWID: the key's B-tree holds the row,
-- one page. Rebuilt in place, their columns as they were, their indexes as
-- they were but for the queue's changes above.
CREATE TABLE queue_new (
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
INSERT INTO queue_new (run_id, function_id, partition_key, available_at, sort_at, owner, epoch,
                       cancel_requested, start_deadline, wake_requested, finish_timeout,
                       finish_deadline, ckey1, limit1, ckey2, limit2, throttle_key, fresh,
                       cancel_reason)
SELECT run_id, function_id, partition_key, available_at, sort_at, owner, epoch, cancel_requested,
       start_deadline, wake_requested, finish_timeout, finish_deadline, ckey1, limit1, ckey2,
       limit2, throttle_key, fresh, cancel_reason
FROM queue;
DROP TABLE queue;
ALTER TABLE queue_new RENAME TO queue;
CREATE INDEX queue_by_owner ON queue (owner);
CREATE INDEX queue_by_partition ON queue (partition_key, fresh, available_at);
CREATE INDEX queue_by_ckey1 ON queue (ckey1, owner) WHERE ckey1 IS NOT NULL;
CREATE INDEX queue_by_ckey2 ON queue (ckey2, owner) WHERE ckey2 IS NOT NULL;
CREATE INDEX queue_by_partition_fresh ON queue (partition_key, sort_at, run_id) WHERE fresh = 1;
CREATE INDEX queue_by_start_deadline ON queue (start_deadline) WHERE start_deadline IS NOT NULL;
CREATE INDEX queue_by_finish_deadline ON queue (finish_deadline) WHERE finish_deadline IS NOT NULL;

CREATE TABLE dedupe_new (
    key         TEXT PRIMARY KEY,
    ref         TEXT NOT NULL,
    expires_at  REAL NOT NULL
) WITHOUT ROWID;
INSERT INTO dedupe_new (key, ref, expires_at) SELECT key, ref, expires_at FROM dedupe;
DROP TABLE dedupe;
ALTER TABLE dedupe_new RENAME TO dedupe;
CREATE INDEX dedupe_by_expiry ON dedupe (expires_at);

CREATE TABLE run_events_new (
    run_id     TEXT NOT NULL,
    position   INTEGER NOT NULL,
    event_seq  INTEGER NOT NULL,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;
INSERT INTO run_events_new (run_id, position, event_seq) SELECT run_id, position, event_seq FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_new RENAME TO run_events;
CREATE INDEX run_events_by_event ON run_events (event_seq);
