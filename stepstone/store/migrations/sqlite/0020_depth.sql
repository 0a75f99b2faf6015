-- A lease pass reads a partition's due items in queue order (partition_items:
-- ORDER BY sort_at, run_id). Through queue_by_partition it read every due item
-- of the partition and sorted them, a cost that grew with the queue's depth
-- (about a second with a million queued runs); through this index it reads
-- the first few in order. Runs parked without a wake time (available_at NULL:
-- waiting for an event) are left out, so they cost a lease pass nothing.
CREATE INDEX queue_by_partition_order ON queue (partition_key, sort_at, run_id)
WHERE available_at IS NOT NULL;
