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
DROP INDEX queue_by_start_deadline;
DROP INDEX queue_by_finish_deadline;
DROP INDEX queue_by_due;
CREATE INDEX queue_by_start_deadline ON queue (start_deadline) WHERE start_deadline IS NOT NULL;
CREATE INDEX queue_by_finish_deadline ON queue (finish_deadline) WHERE finish_deadline IS NOT NULL;
DROP INDEX partitions_by_ckey;
CREATE INDEX partitions_by_ckey ON partitions (ckey) WHERE ckey IS NOT NULL;
DROP INDEX queue_by_partition;
DROP INDEX queue_by_partition_resumed;
CREATE INDEX queue_by_partition ON queue (partition_key, fresh, available_at);
ALTER TABLE queue ADD CONSTRAINT queue_fresh CHECK (fresh IN (0, 1));
