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
                  parent_step_id, idempotency_key, meta, ended_at, singleton_key)
VALUES (:id, :function_id, :status, :event_ids, :created_at, :error, :parent_run_id,
        :parent_step_id, :idempotency_key, :meta, :ended_at, :singleton_key);

-- name: insert_run_event
INSERT INTO run_events (run_id, position, event_seq) VALUES (:run_id, :position, :event_seq);

-- name: insert_queue_item
INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, start_deadline,
                   finish_timeout)
VALUES (:run_id, :function_id, :partition_key, :available_at, :sort_at, :start_deadline,
        :finish_timeout);

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
UPDATE queue SET owner = :owner, epoch = epoch + 1, available_at = :until, wake_requested = 0
WHERE run_id IN (
    SELECT run_id FROM queue
    WHERE available_at <= :now AND function_id IN ({function_ids})
    ORDER BY sort_at
    LIMIT :limit {lock})
RETURNING run_id, epoch, cancel_requested, start_deadline;

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

-- ---------------------------------------------------------------------------
-- Orchestration: waits, wake-ups, cron, timeouts.

-- name: insert_wait
INSERT INTO waits (run_id, step_id, kind, event_name, match_key, match_value, expression,
                   event_json, created_at, expires_at)
VALUES (:run_id, :step_id, :kind, :event_name, :match_key, :match_value, :expression,
        :event_json, :created_at, :expires_at);

-- name: insert_wait_key
INSERT INTO wait_keys (event_name, match_key) VALUES (:event_name, :match_key)
ON CONFLICT (event_name, match_key) DO NOTHING;

-- name: wait_keys
SELECT match_key FROM wait_keys WHERE event_name = :event_name;

-- name: match_waits
SELECT * FROM waits
WHERE event_name = :event_name AND match_key = :match_key AND match_value = :match_value
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY id;

-- name: delete_wait
DELETE FROM waits WHERE id = :id;

-- name: delete_step_waits
DELETE FROM waits WHERE run_id = :run_id AND step_id = :step_id;

-- name: delete_run_waits
DELETE FROM waits WHERE run_id = :run_id;

-- name: child_waits
SELECT * FROM waits WHERE kind = 'invoke' AND event_name = '' AND match_value = :child_run_id;

-- name: complete_waiting_step
UPDATE steps SET status = :status, output = :output, error = :error, ended_at = :now
WHERE run_id = :run_id AND step_id = :step_id AND status = 'waiting';

-- name: wake_run
UPDATE queue SET
    available_at = CASE WHEN owner IS NULL OR available_at <= :now THEN :now ELSE available_at END,
    wake_requested = CASE WHEN owner IS NULL OR available_at <= :now THEN 0 ELSE 1 END
WHERE run_id = :run_id;

-- name: fence_park_wake
UPDATE queue SET owner = NULL, wake_requested = 0,
    available_at = CASE WHEN wake_requested = 1 THEN :now ELSE :available_at END
WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch;

-- name: get_step
SELECT * FROM steps WHERE run_id = :run_id AND step_id = :step_id;

-- name: upsert_cron
INSERT INTO crons (function_id, schedule, next_at) VALUES (:function_id, :schedule, :next_at)
ON CONFLICT (function_id, schedule) DO NOTHING;

-- name: due_crons
SELECT * FROM crons WHERE function_id IN ({function_ids}) AND next_at <= :now;

-- name: next_cron
SELECT MIN(next_at) AS due FROM crons WHERE function_id IN ({function_ids});

-- name: advance_cron
UPDATE crons SET next_at = :next_at
WHERE function_id = :function_id AND schedule = :schedule AND next_at = :expected;

-- name: timed_out
SELECT q.run_id, q.owner, q.available_at, q.start_deadline, q.finish_deadline, r.function_id
FROM queue q JOIN runs r ON r.id = q.run_id
WHERE q.start_deadline <= :now OR q.finish_deadline <= :now
LIMIT :limit;

-- name: next_deadline
SELECT MIN(d) AS due FROM (
    SELECT MIN(start_deadline) AS d FROM queue
    UNION ALL SELECT MIN(finish_deadline) AS d FROM queue) AS deadlines;

-- name: start_clock
UPDATE queue SET start_deadline = NULL,
    finish_deadline = CASE WHEN finish_timeout IS NULL THEN NULL
                           ELSE COALESCE(finish_deadline, :now + finish_timeout) END
WHERE run_id = :run_id;

-- name: clear_deadlines
UPDATE queue SET start_deadline = NULL, finish_deadline = NULL WHERE run_id = :run_id;

-- name: set_singleton
UPDATE runs SET singleton_key = :key WHERE id = :id;
