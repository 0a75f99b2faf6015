-- A lease pass reads a partition's first due items in queue order
-- (partition_items: ORDER BY sort_at, run_id). Through queue_by_partition it
-- read every due item of the partition and sorted them, a cost that grew with
-- the queue's depth (about a second with a million queued runs). It now reads
-- two sets, each cheap at any depth, and merges them:
--  * runs never leased (fresh), in queue order: their available_at is their
--    due time and sort_at that time moved by at most the priority range, so
--    the due ones come first and the read stops after the window;
--  * runs leased before (running, sleeping, waiting, retrying), by due time:
--    only the due ones are read, however many sleep or wait.
CREATE INDEX queue_by_partition_fresh ON queue (partition_key, sort_at, run_id) WHERE fresh = 1;
CREATE INDEX queue_by_partition_resumed ON queue (partition_key, available_at) WHERE fresh = 0;
