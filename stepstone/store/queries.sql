-- Every query Stepstone runs, written once. Parameters are :named; the
-- PostgreSQL store rewrites them. {lock} expands to FOR UPDATE SKIP LOCKED on
-- PostgreSQL and to nothing on SQLite (which serialises writers).

-- name: upsert_function
INSERT INTO functions (id, app, config, updated_at) VALUES (:id, :app, :config, :now)
ON CONFLICT (id) DO UPDATE SET app = excluded.app, config = excluded.config,
    updated_at = excluded.updated_at
WHERE functions.config <> excluded.config OR functions.app <> excluded.app;

-- name: load_functions
SELECT id, app, config FROM functions;

-- name: claim_key
INSERT INTO dedupe (key, ref, expires_at) VALUES (:key, :ref, :expires_at)
ON CONFLICT (key) DO UPDATE SET ref = excluded.ref, expires_at = excluded.expires_at
WHERE dedupe.expires_at <= :now
RETURNING ref;

-- name: get_key
SELECT ref FROM dedupe WHERE key = :key AND expires_at > :now;

-- name: release_key
DELETE FROM dedupe WHERE key = :key AND ref = :ref;

-- name: prune_keys
DELETE FROM dedupe WHERE expires_at <= :now;

-- name: insert_event
INSERT INTO events (id, name, data, ts, received_at) VALUES (:id, :name, :data, :ts, :now)
RETURNING seq;

-- name: insert_run
INSERT INTO runs (id, function_id, status, event_ids, created_at, error, parent_run_id,
                  parent_step_id, idempotency_key, meta, ended_at)
VALUES (:id, :function_id, :status, :event_ids, :created_at, :error, :parent_run_id,
        :parent_step_id, :idempotency_key, :meta, :ended_at);

-- name: insert_run_event
INSERT INTO run_events (run_id, position, event_seq) VALUES (:run_id, :position, :event_seq);

-- name: insert_queue_item
INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, start_deadline)
VALUES (:run_id, :function_id, :partition_key, :available_at, :sort_at, :start_deadline);

-- name: get_run
SELECT * FROM runs WHERE id = :id;

-- name: get_steps
SELECT * FROM steps WHERE run_id = :run_id ORDER BY position;

-- name: get_events
SELECT e.* FROM run_events re JOIN events e ON e.seq = re.event_seq
WHERE re.run_id = :run_id ORDER BY re.position;

-- name: get_spans
SELECT * FROM spans WHERE run_id = :run_id ORDER BY id;

-- name: list_runs
SELECT r.* FROM runs r
WHERE (:function_id IS NULL OR r.function_id = :function_id)
  AND (:any_status = 1 OR r.status IN ({statuses}))
  AND (:since IS NULL OR r.created_at >= :since)
  AND (:until IS NULL OR r.created_at < :until)
  AND (:before_id IS NULL OR r.id < :before_id)
  AND (:event_id IS NULL OR r.id IN (
        SELECT re.run_id FROM run_events re JOIN events e ON e.seq = re.event_seq
        WHERE e.id = :event_id))
ORDER BY r.id DESC
LIMIT :limit;

-- name: lease_queue
UPDATE queue SET owner = :owner, epoch = epoch + 1, available_at = :until
WHERE run_id IN (
    SELECT run_id FROM queue
    WHERE available_at <= :now AND function_id IN ({function_ids})
    ORDER BY sort_at
    LIMIT :limit {lock})
RETURNING run_id, epoch, cancel_requested;

-- name: mark_running
UPDATE runs SET
    status = CASE WHEN status IN ('queued', 'sleeping', 'waiting') THEN 'running' ELSE status END,
    started_at = COALESCE(started_at, :now),
    epoch = :epoch
WHERE id = :id
RETURNING *;

-- name: next_due
SELECT MIN(available_at) AS due FROM queue WHERE function_id IN ({function_ids});

-- name: extend_leases
UPDATE queue SET available_at = :until WHERE owner = :owner AND run_id IN ({run_ids})
RETURNING run_id;

-- name: release_leases
UPDATE queue SET owner = NULL, available_at = :now WHERE owner = :owner;

-- name: fence_check
SELECT cancel_requested FROM queue WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch;

-- name: upsert_step
INSERT INTO steps (run_id, step_id, position, kind, status, attempts, output, error, wake_at,
                   started_at, ended_at)
VALUES (:run_id, :step_id, :position, :kind, :status, :attempts, :output, :error, :wake_at,
        :started_at, :ended_at)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    kind = excluded.kind, status = excluded.status, attempts = excluded.attempts,
    output = excluded.output, error = excluded.error, wake_at = excluded.wake_at,
    started_at = excluded.started_at, ended_at = excluded.ended_at;

-- name: insert_span
INSERT INTO spans (run_id, kind, name, attempt, started_at, ended_at, status, error, detail)
VALUES (:run_id, :kind, :name, :attempt, :started_at, :ended_at, :status, :error, :detail);

-- name: fence_park
UPDATE queue SET owner = NULL, available_at = :available_at
WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch;

-- name: park_run
UPDATE runs SET status = :status, attempt = COALESCE(:attempt, attempt) WHERE id = :id;

-- name: fence_delete
DELETE FROM queue WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch;

-- name: delete_queue_item
DELETE FROM queue WHERE run_id = :run_id;

-- name: finish_run
UPDATE runs SET status = :status, output = :output, error = :error, ended_at = :now
WHERE id = :id AND status NOT IN ('completed', 'failed', 'cancelled', 'skipped');

-- name: queue_item
SELECT * FROM queue WHERE run_id = :run_id;

-- name: flag_cancel
UPDATE queue SET cancel_requested = 1 WHERE run_id = :run_id;

-- name: reopen_run
UPDATE runs SET status = :status, output = NULL, error = NULL, ended_at = NULL, attempt = 0
WHERE id = :id;

-- name: delete_step
DELETE FROM steps WHERE run_id = :run_id AND step_id = :step_id;

-- name: upsert_worker
INSERT INTO workers (id, app, app_version, concurrency, started_at, heartbeat_at, functions)
VALUES (:id, :app, :app_version, :concurrency, :started_at, :heartbeat_at, :functions)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
    concurrency = excluded.concurrency, functions = excluded.functions,
    app_version = excluded.app_version;

-- name: remove_worker
DELETE FROM workers WHERE id = :id;

-- name: list_workers
SELECT * FROM workers WHERE heartbeat_at >= :alive_since ORDER BY id;

-- name: run_backlog
SELECT function_id, COUNT(*) AS due, MIN(available_at) AS oldest FROM queue
WHERE available_at <= :now
GROUP BY function_id;

-- name: count_active_runs
SELECT function_id, status, COUNT(*) AS n FROM runs
WHERE status IN ('queued', 'running', 'sleeping', 'waiting')
GROUP BY function_id, status;

-- name: insert_job
INSERT INTO jobs (id, kind, status, params, done, examined, error, owner, created_at, updated_at,
                  finished_at)
VALUES (:id, :kind, :status, :params, :done, :examined, :error, :owner, :created_at, :updated_at,
        :finished_at);

-- name: get_job
SELECT * FROM jobs WHERE id = :id;

-- name: list_jobs
SELECT * FROM jobs ORDER BY id DESC LIMIT :limit;

-- name: update_job
UPDATE jobs SET status = :status, done = :done, examined = :examined, error = :error,
    updated_at = :now, finished_at = :finished_at
WHERE id = :id AND status IN ('queued', 'running');

-- name: interrupt_stale_jobs
UPDATE jobs SET status = 'interrupted', error = :error, updated_at = :now, finished_at = :now
WHERE status IN ('queued', 'running') AND updated_at < :stale_before;
