-- Every query Stepstone runs, written once. Parameters are :named; the
-- PostgreSQL store rewrites them. {lock} expands to FOR UPDATE SKIP LOCKED on
-- PostgreSQL and {lock_wait} to FOR UPDATE (a writer waits for the row), both
-- to nothing on SQLite (which serialises writers).

-- name: upsert_function
INSERT INTO functions (id, app, config, updated_at) VALUES (:id, :app, :config, :now)
ON CONFLICT (id) DO UPDATE SET app = excluded.app, config = excluded.config,
    updated_at = excluded.updated_at, retired_at = NULL
WHERE functions.config <> excluded.config OR functions.app <> excluded.app
   OR functions.retired_at IS NOT NULL;

-- name: retire_functions
UPDATE functions SET retired_at = :now
WHERE app = :app AND retired_at IS NULL AND id NOT IN ({function_ids});

-- name: load_functions
SELECT id, app, config FROM functions;

-- name: retired_functions
SELECT id, retired_at FROM functions WHERE retired_at IS NOT NULL;

-- name: retire_app_functions
UPDATE functions SET retired_at = :now WHERE app = :app AND retired_at IS NULL
RETURNING id;

-- name: upsert_app
INSERT INTO apps (url, app, app_version, max_duration, function_ids, created_at, synced_at)
VALUES (:url, :app, :app_version, :max_duration, :function_ids, :created_at, :synced_at)
ON CONFLICT (url) DO UPDATE SET app = excluded.app, app_version = excluded.app_version,
    max_duration = excluded.max_duration, function_ids = excluded.function_ids,
    synced_at = excluded.synced_at, error = NULL, error_at = NULL;

-- name: record_app_error
UPDATE apps SET error = :error, error_at = :now WHERE url = :url
RETURNING url;

-- name: get_app
SELECT url, app, app_version, max_duration, function_ids, created_at, synced_at, error, error_at
FROM apps WHERE url = :url;

-- name: list_apps
SELECT url, app, app_version, max_duration, function_ids, created_at, synced_at, error, error_at
FROM apps ORDER BY url;

-- name: delete_app
DELETE FROM apps WHERE url = :url
RETURNING url;

-- name: claim_key
INSERT INTO dedupe (key, ref, expires_at) VALUES (:key, :ref, :expires_at)
{query:key_claimed};

-- name: key_claimed
-- (a fragment: a key is claimed if free or its claim expired; a row back if it was)
ON CONFLICT (key) DO UPDATE SET ref = excluded.ref, expires_at = excluded.expires_at
WHERE dedupe.expires_at <= :now
RETURNING ref

-- name: get_key
SELECT ref FROM dedupe WHERE key = :key AND expires_at > :now;

-- name: release_key
DELETE FROM dedupe WHERE key = :key AND ref = :ref;

-- name: record_event_starting
-- (PostgreSQL: a send's one event and the one run it starts, sent with
-- everything after it and the COMMIT, nothing read before: record_event,
-- unless a wait is on the event's name (a wait key: the waits it may resolve
-- are read and claimed in Python, so the send goes again the usual way), and
-- the run's row (its queue spec a column: not the UPDATE create_run needs on
-- SQLite, set_queue_spec), its link to the event and its partition's hint
-- lowered only if the event was written. The run's id is new: its queue item
-- and take that follow (statements of their own) find it only if it was
-- written here.
-- A row back: the event's seq (NULL: not written) and whether it was awaited.)
WITH {query:event_unawaited}, created AS (
    INSERT INTO runs (id, function_id, status, event_ids, created_at, queue_spec)
    SELECT :run_id, :function_id, :status, :event_ids, :created_at, :queue_spec FROM recorded
), linked AS (
    INSERT INTO run_events (run_id, position, event_seq) SELECT :run_id, 0, seq FROM recorded
), lowered AS (
    INSERT INTO partitions (key, function_id, ckey, next_at)
    SELECT :partition_key, :function_id, :ckey, :available_at FROM recorded
    {query:partition_lowered}
)
SELECT (SELECT seq FROM recorded) AS seq, NOT EXISTS (SELECT 1 FROM unawaited) AS awaited;

-- name: event_unawaited
-- (a fragment, the head of record_event_starting and record_event_started: the
-- event recorded (its dedupe claim and insert), unless a wait key is on its name)
unawaited AS (
    SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM wait_keys WHERE event_name = :name)
), claimed AS (
    INSERT INTO dedupe (key, ref, expires_at) SELECT :key, :ref, :expires_at FROM unawaited
    {query:key_claimed}
), recorded AS (
    INSERT INTO events (id, name, data, ts, received_at, trace)
    SELECT :id, :name, :data, CAST(:ts AS BIGINT), CAST(:now AS DOUBLE PRECISION), :trace
    WHERE EXISTS (SELECT 1 FROM claimed)
    RETURNING seq
)

-- name: record_event_started
-- (PostgreSQL: record_event_starting for a run a local worker of this process
-- takes at once (its lease: :owner until :until, taken at :taken_at, running
-- :app_version; a send's direct start), its queue item in the same statement.
-- Unless a due item of its partition waits (due_ahead: the statement's snapshot
-- holds no item of this new run), the run's row, its queue item and its
-- partition's hint are written as take_runs_in_order and settle_taken leave
-- them: run_started, item_taken (epoch 1: a new run's first lease),
-- clock_started, the partition served now and next due at its earliest item's
-- time, never later than it was (as settle_taken leaves it on PostgreSQL: a run another
-- transaction queued and committed while this one waited for the partition's
-- row is not in this snapshot; the next lease pass settles the hint). Nothing
-- is updated after. Else they are written queued, as
-- record_event_starting and insert_queue_item write them. A row back only if
-- something was written or a wait key is on the name: record_event_starting's
-- and the run's row (NULLs: the run not written).)
WITH {query:event_unawaited}, taking AS (
    SELECT seq, NOT EXISTS (
        SELECT 1 FROM queue WHERE partition_key = :partition_key AND available_at <= :taken_at
    ) AS taken
    FROM recorded
), created AS (
    INSERT INTO runs (id, function_id, status, event_ids, created_at, queue_spec, started_at, app_version, epoch)
    SELECT :run_id, :function_id, CASE WHEN taken THEN 'running' ELSE CAST(:status AS TEXT) END, :event_ids,
           :created_at, :queue_spec, CASE WHEN taken THEN CAST(:taken_at AS DOUBLE PRECISION) END,
           CASE WHEN taken THEN CAST(:app_version AS TEXT) END, CASE WHEN taken THEN 1 ELSE 0 END
    FROM taking
    RETURNING *
), linked AS (
    INSERT INTO run_events (run_id, position, event_seq) SELECT :run_id, 0, seq FROM taking
), queued AS (
    INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, start_deadline,
                       finish_timeout, finish_deadline, ckey1, limit1, ckey2, limit2, throttle_key,
                       epoch, owner, fresh)
    SELECT :run_id, :function_id, :partition_key,
           CASE WHEN taken THEN CAST(:until AS DOUBLE PRECISION) ELSE CAST(:available_at AS DOUBLE PRECISION) END,
           :sort_at, CASE WHEN taken THEN NULL ELSE CAST(:start_deadline AS DOUBLE PRECISION) END,
           CAST(:finish_timeout AS DOUBLE PRECISION),
           CASE WHEN taken THEN CAST(:taken_at AS DOUBLE PRECISION) + CAST(:finish_timeout AS DOUBLE PRECISION) END,
           :ckey1, :limit1, :ckey2, :limit2, :throttle_key,
           CASE WHEN taken THEN 1 ELSE 0 END, CASE WHEN taken THEN CAST(:owner AS TEXT) END,
           CASE WHEN taken THEN 0 ELSE 1 END
    FROM taking
), lowered AS (
    INSERT INTO partitions (key, function_id, ckey, next_at)
    SELECT :partition_key, :function_id, :ckey1, CAST(:available_at AS DOUBLE PRECISION) FROM taking WHERE NOT taken
    {query:partition_lowered}
), settled AS (
    INSERT INTO partitions (key, function_id, ckey, next_at, last_served)
    SELECT :partition_key, :function_id, :ckey1, {query:started_next_at}, CAST(:taken_at AS DOUBLE PRECISION)
    FROM taking WHERE taken
    ON CONFLICT (key) DO UPDATE SET last_served = excluded.last_served,
        next_at = LEAST(partitions.next_at, excluded.next_at)
)
SELECT (SELECT seq FROM recorded) AS seq, NOT EXISTS (SELECT 1 FROM unawaited) AS awaited, created.*
FROM (SELECT 1) AS one LEFT JOIN created ON TRUE
WHERE EXISTS (SELECT 1 FROM recorded) OR NOT EXISTS (SELECT 1 FROM unawaited);

-- name: insert_started_run
-- (SQLite: a send's direct start written taken, in order (record_event_started
-- is PostgreSQL's): the run's row as run_started leaves it, with its first
-- lease's epoch and its queue spec; the row back)
INSERT INTO runs (id, function_id, status, event_ids, created_at, started_at, app_version, epoch, queue_spec)
VALUES (:id, :function_id, :status, :event_ids, :created_at, :taken_at, :app_version, :epoch, :queue_spec)
RETURNING *;

-- name: insert_event
INSERT INTO events (id, name, data, ts, received_at, trace)
VALUES (:id, :name, :data, :ts, :now, :trace)
RETURNING seq;

-- name: record_event
-- (PostgreSQL: claim_key and insert_event in one statement: the event is
-- written only if its dedupe key was claimed now; no row for a duplicate)
WITH claimed AS ({query:claim_key})
INSERT INTO events (id, name, data, ts, received_at, trace)
SELECT :id, :name, :data, CAST(:ts AS BIGINT), CAST(:now AS DOUBLE PRECISION), :trace
WHERE EXISTS (SELECT 1 FROM claimed)
RETURNING seq;

-- name: insert_run
INSERT INTO runs (id, function_id, status, event_ids, created_at, error, parent_run_id,
                  parent_step_id, idempotency_key, meta, ended_at, singleton_key)
VALUES (:id, :function_id, :status, :event_ids, :created_at, :error, :parent_run_id,
        :parent_step_id, :idempotency_key, :meta, :ended_at, :singleton_key);

-- name: insert_run_event
INSERT INTO run_events (run_id, position, event_seq) VALUES (:run_id, :position, :event_seq);

-- name: insert_queue_item
-- (epoch: a run queued again (replay) goes on from the last epoch it was leased
-- under, kept in runs.epoch, so no fence of an older invocation can match again.
-- Only for a run that exists: one record_event_starting did not write gets none)
INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, start_deadline,
                   finish_timeout, ckey1, limit1, ckey2, limit2, throttle_key, epoch)
SELECT :run_id, :function_id, :partition_key, :available_at, :sort_at, :start_deadline,
       :finish_timeout, :ckey1, :limit1, :ckey2, :limit2, :throttle_key, epoch
FROM runs WHERE id = :run_id;

-- name: insert_taken_item
-- (SQLite: insert_queue_item for a run a send's direct start wrote taken
-- (insert_started_run): leased by :owner until :until, its epoch the run's
-- first lease's, not fresh, its start deadline met and its finish clock
-- started (clock_started: :finish_deadline))
INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, finish_timeout,
                   finish_deadline, ckey1, limit1, ckey2, limit2, throttle_key, epoch, owner, fresh)
SELECT :run_id, :function_id, :partition_key, :until, :sort_at, :finish_timeout,
       :finish_deadline, :ckey1, :limit1, :ckey2, :limit2, :throttle_key, epoch, :owner, 0
FROM runs WHERE id = :run_id;

-- name: get_run
SELECT * FROM runs WHERE id = :id;

-- name: lock_run
-- (an operator's action: a prune deleting the run meanwhile is waited for, and
-- then the run is gone; a prune after it sees the run live again)
SELECT * FROM runs WHERE id = :id {lock_wait};

-- name: get_steps
SELECT * FROM steps WHERE run_id = :run_id ORDER BY position;

-- name: step_index
-- (planned at every call on PostgreSQL (store/pgwire.py): prepared, its plan
-- turned generic while `steps` was nearly empty and stayed a sequential scan as
-- the table grew, 5-15 ms a lease pass at 15,000 steps, the partition row held.)
-- (what a lease reads of its runs' memos: everything but the outputs, and their sizes)
SELECT run_id, step_id, position, kind, status, attempts, NULL AS output, error, wake_at,
       started_at, ended_at, fingerprint, {output_bytes} AS output_bytes
FROM steps WHERE run_id IN ({run_ids}) ORDER BY run_id, position;

-- name: step_outputs
-- (the outputs of a run's completed steps at positions first..last: a page of a replay)
SELECT step_id, output FROM steps
WHERE run_id = :run_id AND position BETWEEN :first AND :last AND status = 'completed';

-- name: get_events
SELECT e.* FROM run_events re JOIN events e ON e.seq = re.event_seq
WHERE re.run_id = :run_id ORDER BY re.position;

-- name: get_spans
SELECT * FROM spans WHERE run_id = :run_id ORDER BY id;

-- name: list_runs
SELECT r.* FROM runs r
WHERE {query:run_filter}
ORDER BY r.id DESC
LIMIT :limit;

-- name: list_runs_of_event
SELECT r.* {query:listed_of_event};

-- name: listed_of_event
-- (a fragment, list_runs_of_event's page, included there and in
-- steps_of_event_runs. runs.list(event_id=...): the event's runs found through
-- its id first; in list_runs the event would be a condition tested on every
-- run, newest first)
FROM runs r
WHERE r.id IN ({query:event_run_ids})
  AND {query:run_filter}
ORDER BY r.id DESC
LIMIT :limit

-- name: event_run_ids
SELECT re.run_id FROM run_events re JOIN events e ON e.seq = re.event_seq WHERE e.id = :event_id

-- name: steps_of_event_runs
-- (the steps of list_runs_of_event's page, sent with it and read in the same
-- snapshot. Found through the event's run_events rows: on PostgreSQL runs.id
-- is COLLATE "C" and steps.run_id is not, so steps_pkey cannot seek runs'
-- ids; the page's condition only filters.)
SELECT * FROM steps
WHERE run_id IN ({query:event_run_ids}) AND run_id IN (SELECT r.id {query:listed_of_event})
ORDER BY run_id, position;

-- name: run_filter
-- (the conditions of list_runs, included in it and in list_runs_of_event; the
-- CASTs give PostgreSQL the type of a parameter that may be NULL)
(CAST(:function_id AS TEXT) IS NULL OR r.function_id = :function_id)
  AND (:any_status = 1 OR r.status IN ({statuses}))
  AND (CAST(:since AS DOUBLE PRECISION) IS NULL OR r.created_at >= :since)
  AND (CAST(:until AS DOUBLE PRECISION) IS NULL OR r.created_at < :until)
  AND (CAST(:before_id AS TEXT) IS NULL OR r.id < :before_id)
  AND (CAST(:app_version AS TEXT) IS NULL OR r.app_version = :app_version)

-- name: check_runs
-- (a page of runs for app.check, in id order)
SELECT r.* FROM runs r
WHERE r.function_id IN ({function_ids}) AND r.status IN ({statuses})
  AND (CAST(:after_id AS TEXT) IS NULL OR r.id > :after_id)
ORDER BY r.id
LIMIT :limit;

-- name: steps_if_ended
-- (runs.wait's poll: a run's steps only once it has ended; sent with get_run,
-- without waiting for it, and read in the same snapshot)
SELECT s.* FROM steps s
WHERE s.run_id = :run_id AND EXISTS (SELECT 1 FROM runs r WHERE r.id = :run_id AND r.status IN ({statuses}))
ORDER BY s.position;

-- name: steps_of_runs
SELECT * FROM steps WHERE run_id IN ({run_ids}) ORDER BY run_id, position;

-- name: events_of_runs
SELECT re.run_id, e.* FROM run_events re JOIN events e ON e.seq = re.event_seq
WHERE re.run_id IN ({run_ids}) ORDER BY re.run_id, re.position;

-- name: mark_running
-- (the runs a lease pass took whose queue items take_items gave :epoch: one
-- statement per distinct epoch, a single one when every run is starting. Not a
-- subquery on queue by runs.id: on PostgreSQL runs.id is COLLATE "C" and the
-- queue's key is not, so that comparison could not use the key: a scan.)
UPDATE runs SET {query:run_started}, epoch = :epoch
WHERE id IN ({run_ids})
RETURNING *;

-- name: run_started
-- (a fragment, included: what a lease pass sets on a run it takes)
status = CASE WHEN status IN ('queued', 'sleeping', 'waiting') THEN 'running' ELSE status END,
    started_at = COALESCE(started_at, :now),
    app_version = COALESCE(:app_version, app_version)

-- name: next_due
SELECT MIN(next_at) AS due FROM partitions WHERE function_id IN ({function_ids});

-- name: extend_leases
-- (rows another transaction is changing are skipped, not waited for: that is a
-- park or finish of the same run, and waiting could deadlock with it. A lease
-- that lapsed is never extended: others may have acted on its expiry.)
UPDATE queue SET available_at = :until
WHERE run_id IN (SELECT run_id FROM queue
                 WHERE owner = :owner AND available_at > :now AND run_id IN ({run_ids}) {lock})
RETURNING run_id;

-- name: release_leases
UPDATE queue SET owner = NULL, available_at = :now WHERE owner = :owner;

-- name: wake_owner_partitions
UPDATE partitions SET next_at = :now
WHERE key IN (SELECT partition_key FROM queue WHERE owner = :owner)
  AND (next_at IS NULL OR next_at > :now);

-- name: fence_check
-- (Writers are serial where this is used: SQLite. PostgreSQL calls
-- stepstone_fence, which also holds the row until commit: fence_or_raise.)
SELECT cancel_requested FROM queue WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch;

-- name: fence_or_raise
-- (PostgreSQL: the fence's queue row read and held until commit (FOR SHARE, as
-- stepstone_fence does); where it does not hold, stepstone_fence raises SQLSTATE
-- SS001 (migration 0006). Called only then: the PL/pgSQL call costs the server
-- about twice the plain locking read, on every checkpoint's round trip.)
SELECT COALESCE(
    (SELECT cancel_requested FROM queue
     WHERE run_id = :fence_run_id AND owner = :owner AND epoch = :epoch FOR SHARE),
    stepstone_fence(:fence_run_id, :owner, :epoch)) AS cancel_requested;

-- name: upsert_step
INSERT INTO steps (run_id, step_id, position, kind, status, attempts, output, error, wake_at,
                   started_at, ended_at, fingerprint)
VALUES (:run_id, :step_id, :position, :kind, :status, :attempts, :output, :error, :wake_at,
        :started_at, :ended_at, :fingerprint)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    kind = excluded.kind, status = excluded.status, attempts = excluded.attempts,
    output = excluded.output, error = excluded.error, wake_at = excluded.wake_at,
    started_at = excluded.started_at, ended_at = excluded.ended_at,
    fingerprint = excluded.fingerprint
-- A step starts waiting only when it is new: a 'waiting' row over an existing
-- one is a repeated commit, and the step may have been resolved meanwhile.
WHERE excluded.status <> 'waiting';

-- name: fenced_step
-- (PostgreSQL: a checkpoint of one memo in one statement. The fence raises
-- SQLSTATE SS001 when it does not hold, and then the statement writes
-- nothing; the upsert, a data-modifying CTE, runs to completion whether read
-- or not.)
WITH saved AS (
{query:upsert_step}
)
{query:fence_or_raise};

-- name: insert_span
INSERT INTO spans (run_id, kind, name, attempt, started_at, ended_at, status, error, detail)
VALUES (:run_id, :kind, :name, :attempt, :started_at, :ended_at, :status, :error, :detail);

-- name: park_run
UPDATE runs SET status = :status, attempt = COALESCE(:attempt, attempt), written_by = :token
WHERE id = :id;

-- name: park_held_run
-- (PostgreSQL: a held run's park in one statement: fence_park_wake, its
-- partition's hint lowered (lower_partition) and, unless a cancel was
-- requested, park_run. No row: the fence did not hold, and the caller rolls
-- the transaction back.)
WITH parked AS (
{query:fence_park_wake}
), lowered AS (
    INSERT INTO partitions (key, function_id, ckey, next_at)
    SELECT partition_key, function_id, ckey1, available_at FROM parked WHERE available_at IS NOT NULL
    {query:partition_lowered}
), marked AS (
{query:park_run} AND EXISTS (SELECT 1 FROM parked WHERE cancel_requested = 0)
)
SELECT * FROM parked;

-- name: fence_delete
DELETE FROM queue WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch
RETURNING partition_key, function_id, ckey1, ckey2, available_at;

-- name: cancel_reason
SELECT cancel_reason FROM queue WHERE run_id = :run_id AND cancel_requested <> 0;

-- name: delete_queue_item
DELETE FROM queue WHERE run_id = :run_id
RETURNING partition_key, function_id, ckey1, ckey2, available_at;

-- name: finish_run
UPDATE runs SET status = :status, output = :output, error = :error, ended_at = :now,
    written_by = :token
WHERE id = :id AND status NOT IN ('completed', 'failed', 'cancelled', 'skipped');

-- name: run_end_probe
-- (what an ended run must still resolve: a parent's step.invoke waiting on it,
-- a wait for the event its end publishes)
SELECT EXISTS ({query:child_waits}) AS invoked, EXISTS ({query:wait_keys}) AS waited;

-- name: end_held_run
-- (PostgreSQL: a held run's end in one statement: the fenced delete of its
-- queue item, its row ended (finish_run, only if the fence holds), its waits
-- dropped (only if it ended here), and run_end_probe, read before the deletes.
-- No row: the fence did not hold, and the caller rolls the transaction back.
-- The queue item is deleted, and so locked, before the CTEs run: the main
-- statement reads `done` in its RETURNING.)
WITH done AS (
{query:finish_run}
    AND EXISTS (SELECT 1 FROM queue WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch)
    RETURNING id
), cleared AS (
{query:delete_run_waits} AND EXISTS (SELECT 1 FROM done)
), probe AS (
{query:run_end_probe}
)
{query:fence_delete},
    EXISTS (SELECT 1 FROM done) AS finished,
    (SELECT invoked FROM probe) AS invoked, (SELECT waited FROM probe) AS waited;

-- name: end_alone
-- (PostgreSQL: end_held_run for an end guessed to resolve nothing more than
-- itself, sent without reading its row (migration 0025). The fenced delete of
-- the queue item comes first (done reads it), then the run's row and its
-- waits as in end_held_run. Aborts the transaction with SQLSTATE SS001 when
-- the fence does not hold, and with SS002 when the guess was wrong: the run
-- had already ended, its item held concurrency slots (wake_ckey), or
-- run_end_probe finds a parent's invoke or a wait for the event its end
-- publishes; the store then runs the end again through end_held_run.)
WITH gone AS (
{query:fence_delete}
), done AS (
{query:finish_run}
    AND EXISTS (SELECT 1 FROM gone)
    RETURNING id
), cleared AS (
{query:delete_run_waits} AND EXISTS (SELECT 1 FROM done)
)
SELECT CASE WHEN fenced AND alone THEN TRUE  -- (PL/pgSQL only to raise: see fence_or_raise)
            ELSE stepstone_end_alone(:run_id, :owner, fenced, alone) END AS alone
FROM (
    SELECT EXISTS (SELECT 1 FROM gone) AS fenced,
           EXISTS (SELECT 1 FROM done) AND NOT invoked AND NOT waited
           AND NOT EXISTS (SELECT 1 FROM gone WHERE ckey1 IS NOT NULL OR ckey2 IS NOT NULL) AS alone
    FROM ({query:run_end_probe}) AS probe
) AS guess;

-- name: queue_item
SELECT * FROM queue WHERE run_id = :run_id;

-- name: flag_cancel
-- (only a live lease is flagged, in the same statement that checks it, so the
-- check cannot go stale: an owner that parks or finishes first makes this
-- match nothing and the caller ends the run itself. The first reason stays.)
UPDATE queue SET cancel_requested = 1,
    cancel_reason = CASE WHEN cancel_requested = 0 THEN :reason ELSE cancel_reason END
WHERE run_id = :run_id AND owner IS NOT NULL AND available_at > :now
RETURNING run_id;

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
-- (part 0 is the wait; parts 1.. carry more index values of it: migration 0024)
INSERT INTO waits (run_id, step_id, kind, event_name, match_key, match_value, expression,
                   event_json, created_at, expires_at, part, match_number, key_version)
VALUES (:run_id, :step_id, :kind, :event_name, :match_key, :match_value, :expression,
        :event_json, :created_at, :expires_at, :part, :match_number,
        (SELECT version FROM wait_keys WHERE event_name = :event_name AND match_key = :match_key))
ON CONFLICT (run_id, step_id, event_name, part) DO NOTHING;

-- name: insert_step_wait
-- A step's wait, inserted only while the step waits and has none yet: a
-- repeated commit inserts nothing, even if the wait was resolved meanwhile.
INSERT INTO waits (run_id, step_id, kind, event_name, match_key, match_value, expression,
                   event_json, created_at, expires_at, part, match_number, key_version)
SELECT CAST(:run_id AS TEXT), CAST(:step_id AS TEXT), CAST(:kind AS TEXT),
       CAST(:event_name AS TEXT), CAST(:match_key AS TEXT), CAST(:match_value AS TEXT),
       CAST(:expression AS TEXT), CAST(:event_json AS TEXT),
       CAST(:created_at AS DOUBLE PRECISION), CAST(:expires_at AS DOUBLE PRECISION),
       CAST(:part AS INTEGER), CAST(:match_number AS DOUBLE PRECISION),
       (SELECT version FROM wait_keys WHERE event_name = :event_name AND match_key = :match_key)
WHERE EXISTS (SELECT 1 FROM steps WHERE run_id = :run_id AND step_id = :step_id
              AND status = 'waiting')
ON CONFLICT (run_id, step_id, event_name, part) DO NOTHING;

-- name: set_wait_match
UPDATE waits SET match_value = :match_value WHERE run_id = :run_id AND step_id = :step_id;

-- name: written_by
SELECT written_by FROM runs WHERE id = :id;

-- name: insert_wait_key
-- (an update, not DO NOTHING: it locks an existing key row, so retention's
-- orphan_wait_keys and this are ordered on PostgreSQL; and the lock, held to
-- the commit, makes the versions count waits in commit order. Run before the
-- wait's insert, which keeps the version it took: migration 0024.)
INSERT INTO wait_keys (event_name, match_key, version, born) VALUES (:event_name, :match_key, 1, :born)
ON CONFLICT (event_name, match_key) DO UPDATE SET version = wait_keys.version + 1;

-- name: wait_keys
SELECT match_key FROM wait_keys WHERE event_name = :event_name;

-- name: wait_key_version
SELECT version, born FROM wait_keys WHERE event_name = :event_name AND match_key = :match_key;

-- name: unindexed_waits_after
-- (waits_by_key_version: the unindexed waits committed since a survey)
SELECT * FROM waits
WHERE event_name = :event_name AND match_key = '' AND key_version > :version
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY id;

-- name: match_waits
SELECT * FROM waits
WHERE event_name = :event_name AND match_key = :match_key AND match_value = :match_value
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY id;

-- name: match_any_waits
SELECT * FROM waits
WHERE event_name = :event_name AND match_key = :match_key AND match_value IN ({values})
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY id;

-- name: match_range_waits
-- (waits_by_number: a range scan over the waiting runs' numbers, migration 0024)
SELECT * FROM waits
WHERE event_name = :event_name AND match_key = :match_key
  AND match_number >= :low AND match_number <= :high
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY id;

-- name: events_since
-- wait_for_event(lookback=): events of the waited names committed in the
-- window, oldest first (events_by_name).
SELECT * FROM events
WHERE name IN ({names}) AND received_at >= :since AND received_at <= :now
ORDER BY received_at, seq
LIMIT :limit;

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
-- (wake_requested whenever an owner is recorded, even one whose lease lapsed:
-- it may still come back and park the run, and its park must see the wake-up)
UPDATE queue SET
    available_at = CASE WHEN owner IS NULL OR available_at <= :now THEN :now ELSE available_at END,
    wake_requested = CASE WHEN owner IS NULL THEN 0 ELSE 1 END
WHERE run_id = :run_id
RETURNING partition_key, function_id, ckey1, ckey2, available_at;

-- name: fence_park_wake
-- (a wake-up or a cancel requested while the run was held makes it due now;
-- the caller ends a cancelled run in the same transaction)
UPDATE queue SET owner = NULL, wake_requested = 0,
    available_at = CASE WHEN wake_requested = 1 OR cancel_requested <> 0 THEN :now
                        ELSE :available_at END
WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch
RETURNING partition_key, function_id, ckey1, ckey2, available_at, cancel_requested;

-- name: get_step
SELECT * FROM steps WHERE run_id = :run_id AND step_id = :step_id;

-- name: upsert_cron
INSERT INTO crons (function_id, schedule, next_at) VALUES (:function_id, :schedule, :next_at)
ON CONFLICT (function_id, schedule) DO NOTHING;

-- name: due_crons
SELECT * FROM crons WHERE function_id IN ({function_ids}) AND next_at <= :now;

-- name: crons_of
SELECT function_id, schedule, next_at FROM crons WHERE function_id IN ({function_ids});

-- name: delete_stale_cron
-- (A schedule some live worker hosts is advanced as soon as it is due, so its
-- next_at is never long past; the condition keeps such a row.)
DELETE FROM crons WHERE function_id = :function_id AND schedule = :schedule AND next_at < :before;

-- name: advance_cron
UPDATE crons SET next_at = :next_at
WHERE function_id = :function_id AND schedule = :schedule AND next_at = :expected;

-- name: timed_out
SELECT q.run_id, q.owner, q.available_at, q.start_deadline, q.finish_deadline, r.function_id
FROM queue q JOIN runs r ON r.id = q.run_id
WHERE q.start_deadline <= :now OR q.finish_deadline <= :now
LIMIT :limit;

-- name: next_deadline
-- (the deadline indexes are partial: IS NOT NULL lets the planner use them)
SELECT MIN(d) AS due FROM (
    SELECT MIN(start_deadline) AS d FROM queue WHERE start_deadline IS NOT NULL
    UNION ALL SELECT MIN(finish_deadline) AS d FROM queue WHERE finish_deadline IS NOT NULL) AS deadlines;

-- name: next_times
-- (the end of a lease pass: next_due and next_deadline in one statement)
SELECT ({query:next_due}) AS due, ({query:next_deadline}) AS deadline;

-- name: start_clock
UPDATE queue SET {query:clock_started} WHERE run_id IN ({run_ids});

-- name: clock_started
-- (a fragment, included: a taken item's start deadline is met, its finish clock runs)
start_deadline = NULL,
    finish_deadline = CASE WHEN finish_timeout IS NULL THEN NULL
                           ELSE COALESCE(finish_deadline, :now + finish_timeout) END

-- name: take_runs
-- (PostgreSQL: take_items, start_clock and mark_running in one statement. The
-- items are updated first (the main statement reads `taken`), then their runs,
-- as the three statements did; `before` reads the statement's snapshot: the
-- start deadline an item had before it was taken. runs.id is COLLATE "C":
-- the join says so, so that the runs' key is used.)
WITH before AS (
    SELECT run_id, start_deadline FROM queue WHERE run_id IN ({run_ids})
), {query:take_before}

-- name: take_runs_in_order
-- (PostgreSQL: a send's direct start, take_runs unless a due item of the
-- partition other than the runs the send queued waits: due_ahead folded in)
WITH before AS (
    SELECT run_id, start_deadline FROM queue WHERE run_id IN ({run_ids})
      AND NOT EXISTS ({query:due_ahead})
), {query:take_before}

-- name: take_before
-- (a fragment: what take_runs and take_runs_in_order do with the items `before` names)
taken AS (
    UPDATE queue SET {query:item_taken}, {query:clock_started}
    FROM before WHERE queue.run_id = before.run_id
    RETURNING queue.run_id, queue.epoch, queue.cancel_requested, before.start_deadline
)
UPDATE runs SET {query:run_started}, epoch = taken.epoch
FROM taken WHERE runs.id = taken.run_id COLLATE "C"
RETURNING runs.*, taken.run_id, taken.cancel_requested, taken.start_deadline

-- name: clear_deadlines
UPDATE queue SET start_deadline = NULL, finish_deadline = NULL WHERE run_id = :run_id;

-- ---------------------------------------------------------------------------
-- Flow control: partitions, concurrency keys, GCRA, debounce, batch.

-- name: lower_partition
INSERT INTO partitions (key, function_id, ckey, next_at) VALUES (:key, :function_id, :ckey, :at)
{query:partition_lowered};

-- name: partition_lowered
-- (a fragment, included: a partition's hint only ever moves earlier here)
ON CONFLICT (key) DO UPDATE SET next_at = excluded.next_at
WHERE partitions.next_at IS NULL OR partitions.next_at > excluded.next_at

-- name: wake_ckey
-- Every partition of the key is written, even one already due: the row lock
-- orders this release against a lease pass serving the partition (which holds
-- it), so the pass cannot park the partition on a count that misses the slot
-- freed here. (Its lease pass skips the partition while this transaction runs.)
UPDATE partitions SET next_at = CASE WHEN next_at IS NULL OR next_at > :now THEN :now ELSE next_at END
WHERE ckey = :ckey;

-- name: wake_function_partitions
UPDATE partitions SET next_at = :now
WHERE function_id = :function_id AND (next_at IS NULL OR next_at > :now);

-- name: due_partitions
SELECT key, function_id FROM partitions
WHERE next_at <= :now AND function_id IN ({function_ids})
ORDER BY last_served, key
LIMIT :limit {lock};

-- name: partition_items
-- ({lock}: an item another transaction is changing is skipped, not waited for.
-- Those writers lock queue rows before the partition row this lease pass
-- holds, so waiting could deadlock; each of them lowers the partition hint
-- once it commits, so the item is looked at again.)
-- Two reads merged (migration 0020): never-leased runs in queue order through
-- queue_by_partition_fresh (the unary + keeps the planner off the available_at
-- range, which would read and sort every due item), and resumed runs by due
-- time through queue_by_partition (partition_key, fresh, available_at: since
-- migration 0026; sleeping and waiting ones are not read). Each is cheap at
-- any depth; tests/integration/test_depth_plans.py
-- holds the plans on both databases.
SELECT run_id, function_id, ckey1, limit1, ckey2, limit2, throttle_key, fresh, sort_at FROM (
    SELECT run_id, function_id, ckey1, limit1, ckey2, limit2, throttle_key, fresh, sort_at
    FROM queue WHERE partition_key = :key AND fresh = 1 AND +available_at <= :now
    ORDER BY sort_at, run_id LIMIT :limit {lock}
) AS never_leased
UNION ALL
SELECT run_id, function_id, ckey1, limit1, ckey2, limit2, throttle_key, fresh, sort_at FROM (
    SELECT run_id, function_id, ckey1, limit1, ckey2, limit2, throttle_key, fresh, sort_at
    FROM queue WHERE partition_key = :key AND fresh = 0 AND available_at <= :now
    ORDER BY sort_at, run_id LIMIT :limit {lock}
) AS resumed
ORDER BY sort_at, run_id
LIMIT :limit;

-- name: due_ahead
-- (a direct start's queue-order check: is a due item of the partition other
-- than the runs the send queued waiting? A plain read through queue_by_partition,
-- (partition_key, fresh, available_at): a seek per value of fresh, stopping at
-- the first.)
SELECT run_id FROM queue
WHERE partition_key = :key AND fresh IN (0, 1) AND available_at <= :now
  AND run_id NOT IN ({queued_ids})
LIMIT 1;

-- name: settle_taken
-- (a direct start took every due item of the partition: it is next due at its
-- earliest item's time, a lease's expiry at the latest: partition_first.
-- Raised to it only where writers are serial (:raise = 1, SQLite): with
-- concurrent writers (PostgreSQL) an item another transaction queued and
-- committed while this statement waited for the partition's row is not in its
-- snapshot, and raising the hint over it would hide it from every lease pass
-- until the hint came due; there it is only ever lowered, and the next lease
-- pass (which reads the items after locking the row) settles it.
-- Only if the take took: :run_id, one of the runs it took, queued in this
-- transaction (no other can hold it), is :owner's. So on PostgreSQL it goes
-- out right behind its take, before the take's rows are read.)
UPDATE partitions SET last_served = :now, next_at = CASE
    WHEN :raise = 1 OR next_at IS NULL OR next_at > ({query:partition_first}) THEN ({query:partition_first})
    ELSE next_at END
WHERE key = :key AND EXISTS (SELECT 1 FROM queue WHERE run_id = :run_id AND owner = :owner);

-- name: notify_untaken
-- (PostgreSQL: the NOTIFY of a transaction whose only work made available is
-- runs it queued and took itself (a send's direct start), sent before its
-- COMMIT with the takes' results not yet read: other processes' workers are
-- woken only if one of those runs was not taken (a due item waited before
-- it). A row back: it notified.)
SELECT pg_notify(:channel, '') AS notified
WHERE EXISTS (SELECT 1 FROM queue WHERE run_id IN ({run_ids}) AND owner IS NULL);

-- name: settle_started
-- (SQLite: the partition of a run written taken (insert_started_run, its item
-- inserted before) left as settle_taken leaves it)
INSERT INTO partitions (key, function_id, ckey, next_at, last_served)
VALUES (:partition_key, :function_id, :ckey1, {query:started_next_at}, :taken_at)
{query:partition_settled};

-- name: started_next_at
-- (a fragment: settle_taken's next due time for a partition where a run was
-- written taken, its lease until :until: its earliest item's time; whether the
-- new item is visible yet (a CTE's snapshot) or not, the same. The inner
-- MINs are partition_first's: a seek per value of fresh on queue_by_partition,
-- at any depth.)
(SELECT MIN(at) FROM (
    SELECT MIN(available_at) AS at FROM queue WHERE partition_key = :partition_key AND fresh = 0
    UNION ALL SELECT MIN(available_at) FROM queue WHERE partition_key = :partition_key AND fresh = 1
    UNION ALL SELECT CAST(:until AS DOUBLE PRECISION)
) AS times)

-- name: partition_settled
-- (a fragment: a partition a direct start served, as settle_taken leaves it)
ON CONFLICT (key) DO UPDATE SET next_at = excluded.next_at, last_served = excluded.last_served

-- name: live_ckey1
SELECT COUNT(*) AS n FROM queue WHERE ckey1 = :ckey AND owner IS NOT NULL AND available_at > :now;

-- name: live_ckey2
SELECT COUNT(*) AS n FROM queue WHERE ckey2 = :ckey AND owner IS NOT NULL AND available_at > :now;

-- name: item_taken
-- (a fragment, included below: what a lease pass sets on a queue item it takes)
owner = :owner, epoch = epoch + 1, available_at = :until, wake_requested = 0, fresh = 0

-- name: take_items
-- (the items a lease pass chose in one partition, in one statement; on
-- PostgreSQL partition_items holds their rows)
UPDATE queue SET {query:item_taken}
WHERE run_id IN ({run_ids})
RETURNING run_id, epoch, cancel_requested, start_deadline;

-- name: partition_times
-- (A plain read: it sees the rows a lease pass skipped as locked. Index seeks
-- on queue_by_partition, not a pass over the partition's items.)
SELECT (SELECT MIN(at) FROM (
            SELECT MIN(available_at) AS at FROM queue
            WHERE partition_key = :key AND fresh = 0 AND available_at > :now
            UNION ALL SELECT MIN(available_at) FROM queue
            WHERE partition_key = :key AND fresh = 1 AND available_at > :now) AS later) AS next_at,
       ({query:partition_first}) AS first_at;

-- name: partition_first
-- (a fragment: the earliest time of partition :key's items, a seek for each
-- value of fresh in queue_by_partition, (partition_key, fresh, available_at))
SELECT MIN(at) FROM (
    SELECT MIN(available_at) AS at FROM queue WHERE partition_key = :key AND fresh = 0
    UNION ALL SELECT MIN(available_at) FROM queue WHERE partition_key = :key AND fresh = 1) AS firsts

-- name: settle_partition
UPDATE partitions SET next_at = :next_at, last_served = :now WHERE key = :key;

-- name: settle_partition_due
-- (settle_partition for a partition a lease pass leaves due: it filled its
-- slots first. Named apart: on PostgreSQL its commit notifies the other
-- processes, whose passes skipped the partition while this one held it.)
{query:settle_partition};

-- name: delete_partition
DELETE FROM partitions WHERE key = :key;

-- name: gcra_get
SELECT tat FROM gcra WHERE key = :key;

-- name: gcra_set
INSERT INTO gcra (key, tat) VALUES (:key, :tat) ON CONFLICT (key) DO UPDATE SET tat = excluded.tat;

-- name: get_debounce
SELECT run_id, first_at FROM debounces WHERE key = :key;

-- name: put_debounce
INSERT INTO debounces (key, run_id, first_at) VALUES (:key, :run_id, :first_at)
ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, first_at = excluded.first_at;

-- name: get_batch
SELECT run_id, size, first_at FROM batches WHERE key = :key;

-- name: put_batch
INSERT INTO batches (key, run_id, size, first_at) VALUES (:key, :run_id, :size, :first_at)
ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, size = excluded.size,
    first_at = excluded.first_at;

-- name: delete_batch
DELETE FROM batches WHERE key = :key;

-- name: drop_debounce_of
DELETE FROM debounces WHERE run_id IN ({run_ids});

-- name: drop_batch_of
DELETE FROM batches WHERE run_id IN ({run_ids});

-- name: lease_of
-- ({lock_wait}: a cancellation waits for a lease pass holding the item, then
-- sees the lease and flags the run instead of ending it under its new owner.)
SELECT owner, available_at FROM queue WHERE run_id = :run_id {lock_wait};

-- name: pending_item
-- ({lock_wait}: a join waits for a lease pass holding the item; once that pass
-- commits, the row is re-checked and no longer pending, and the join starts a
-- new run instead of rewriting the leased one.)
SELECT * FROM queue WHERE run_id = :run_id AND owner IS NULL AND fresh = 1 {lock_wait};

-- name: move_item
UPDATE queue SET available_at = :at, sort_at = :sort_at WHERE run_id = :run_id;

-- name: set_run_events
UPDATE runs SET event_ids = :event_ids WHERE id = :id;

-- name: replace_run_event
UPDATE run_events SET event_seq = :event_seq WHERE run_id = :run_id AND position = :position;

-- name: set_queue_spec
UPDATE runs SET queue_spec = :spec WHERE id = :id;

-- name: run_backlog
-- (each partition's due items, counted through queue_by_partition: every
-- queued item's partition has a row, a lease pass drops one only once it has
-- no item, and a partition is one function's. A read per partition, never a
-- pass over the queue or a sort of its due items.)
SELECT function_id, SUM(due) AS due, MIN(oldest) AS oldest FROM (
    SELECT p.function_id,
           (SELECT COUNT(*) FROM queue q
            WHERE q.partition_key = p.key AND q.fresh IN (0, 1) AND q.available_at <= :now) AS due,
           (SELECT MIN(q.available_at) FROM queue q
            WHERE q.partition_key = p.key AND q.fresh IN (0, 1) AND q.available_at <= :now) AS oldest
    FROM partitions p) AS per_partition
GROUP BY function_id
HAVING SUM(due) > 0;

-- name: count_active_runs
SELECT function_id, status, COUNT(*) AS n FROM runs
WHERE status IN ('queued', 'running', 'sleeping', 'waiting', 'paused')
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

-- ---------------------------------------------------------------------------
-- Operator views (dashboard): run counts, backlog per concurrency key,
-- timelines, the event log and the runs each event started.

-- name: count_runs
SELECT function_id, status, COUNT(*) AS n FROM runs
WHERE (CAST(:function_id AS TEXT) IS NULL OR function_id = :function_id)
  AND (CAST(:since AS DOUBLE PRECISION) IS NULL OR created_at >= :since)
  AND (CAST(:until AS DOUBLE PRECISION) IS NULL OR created_at < :until)
GROUP BY function_id, status;

-- name: key_backlog
SELECT function_id, ckey1, ckey2, MAX(limit1) AS limit1, MAX(limit2) AS limit2,
       SUM(CASE WHEN available_at <= :now THEN 1 ELSE 0 END) AS due,
       SUM(CASE WHEN owner IS NOT NULL AND available_at > :now THEN 1 ELSE 0 END) AS leased,
       COUNT(*) AS total
FROM queue
GROUP BY function_id, ckey1, ckey2
ORDER BY function_id, COUNT(*) DESC
LIMIT :limit;

-- name: run_timeline
-- (whole seconds by truncation: SQLite's CAST truncates, PostgreSQL's rounds,
-- so a value rounded up is brought back down)
SELECT (CAST(created_at AS BIGINT)
        - CASE WHEN CAST(created_at AS BIGINT) > created_at THEN 1 ELSE 0 END
        - :origin) / :width AS bucket, status, COUNT(*) AS n,
       COUNT(started_at) AS started,
       SUM(CASE WHEN started_at IS NULL THEN 0 ELSE started_at - created_at END) AS delay_sum,
       MAX(started_at - created_at) AS delay_max
FROM runs
WHERE created_at >= :origin AND created_at < :until
  AND (CAST(:function_id AS TEXT) IS NULL OR function_id = :function_id)
GROUP BY bucket, status;

-- name: list_events
SELECT * FROM events
WHERE (CAST(:name AS TEXT) IS NULL OR name = :name)
  AND (CAST(:event_id AS TEXT) IS NULL OR id = :event_id)
  AND (CAST(:before_seq AS BIGINT) IS NULL OR seq < :before_seq)
ORDER BY seq DESC
LIMIT :limit;

-- name: event_runs
SELECT re.event_seq, r.id, r.function_id, r.status FROM run_events re
JOIN runs r ON r.id = re.run_id
WHERE re.event_seq IN ({seqs})
ORDER BY r.id;

-- Transactional steps (store/usertx.py): the user's function runs in a
-- savepoint of the step's checkpoint transaction. On PostgreSQL it runs under a
-- transaction-local statement timeout ({ms}: milliseconds, set by the code),
-- taken back before the savepoint is released (RESET: Stepstone never sets it
-- otherwise); each pair is sent as one round trip (no parameters).
-- name: user_savepoint
SAVEPOINT stepstone_user;

-- name: user_release
RELEASE SAVEPOINT stepstone_user;

-- name: user_rollback
ROLLBACK TO SAVEPOINT stepstone_user;

-- name: user_savepoint_bounded
SAVEPOINT stepstone_user; SET LOCAL statement_timeout = {ms};

-- name: user_release_bounded
RESET statement_timeout; RELEASE SAVEPOINT stepstone_user;

-- ---------------------------------------------------------------------------
-- Signals (issue 14): buffered per run, consumed once, in the order sent.

-- name: insert_signal
INSERT INTO signals (id, run_id, name, data, sent_at, consumed_by, consumed_at)
VALUES (:id, :run_id, :name, :data, :sent_at, :consumed_by, :consumed_at);

-- name: take_signal
-- (the oldest unconsumed signal of the name, only while the receiving step
-- waits: a repeated commit of the step, already completed, takes none)
UPDATE signals SET consumed_by = :step_id, consumed_at = :now
WHERE seq = (SELECT seq FROM signals WHERE run_id = :run_id AND name = :name
             AND consumed_by IS NULL ORDER BY seq LIMIT 1)
  AND EXISTS (SELECT 1 FROM steps WHERE run_id = :run_id AND step_id = :step_id
              AND status = 'waiting')
RETURNING *;

-- name: signal_waits
SELECT * FROM waits
WHERE run_id = :run_id AND kind = 'signal' AND match_value = :name
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY id;

-- name: run_signals
SELECT * FROM signals WHERE run_id = :run_id ORDER BY seq;

-- Database size and retention (issue 17; store/sqlretention.py). Table names
-- come from the database's own catalog ({table} is one of them, quoted).
-- name: table_names_sqlite
-- (the catalog's own words are parameters: literals in this file are domain words)
SELECT name FROM sqlite_master WHERE type = :kind AND name NOT LIKE :internal ORDER BY name;

-- name: table_names_postgres
SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename;

-- name: count_rows
SELECT COUNT(*) AS n FROM {table};

-- name: has_dbstat_sqlite
SELECT COUNT(*) AS n FROM pragma_module_list WHERE name = :module;

-- name: table_bytes_sqlite
-- (every page of a table and of its indexes, counted against the table)
SELECT m.tbl_name AS name, SUM(d.pgsize) AS bytes
FROM dbstat d JOIN sqlite_master m ON m.name = d.name
GROUP BY m.tbl_name;

-- name: table_bytes_postgres
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = :kind;

-- name: database_bytes_sqlite
SELECT page_count * page_size AS bytes FROM pragma_page_count(), pragma_page_size();

-- name: database_bytes_postgres
SELECT pg_database_size(current_database()) AS bytes;

-- name: oldest_ended_run
SELECT * FROM runs WHERE ended_at IS NOT NULL AND status IN ({statuses})
ORDER BY ended_at LIMIT 1;

-- name: prunable_runs
-- Ended before :cutoff, oldest first, except a run a live run invoked (its
-- parent) or waits on (an invoke wait names it): kept until that run ends.
-- (status || '': the status index must not be chosen over runs_by_ended,
-- which gives the oldest first without sorting every ended run)
SELECT r.id FROM runs r
WHERE r.ended_at IS NOT NULL AND r.ended_at < :cutoff AND r.status || '' IN ({statuses})
  AND NOT EXISTS (SELECT 1 FROM runs p
                  WHERE p.id = r.parent_run_id AND p.status NOT IN ({statuses}))
  AND NOT EXISTS (SELECT 1 FROM waits w
                  WHERE w.kind = 'invoke' AND w.event_name = '' AND w.match_value = r.id)
ORDER BY r.ended_at
LIMIT :limit;

-- name: delete_runs
-- (the status and end are checked again on the row: a run replayed since it
-- was chosen is live again and stays)
DELETE FROM runs
WHERE id IN ({run_ids}) AND ended_at IS NOT NULL AND ended_at < :cutoff AND status IN ({statuses})
RETURNING id;

-- name: delete_run_steps
DELETE FROM steps WHERE run_id IN ({run_ids});

-- name: delete_run_spans
DELETE FROM spans WHERE run_id IN ({run_ids});

-- name: delete_run_links
DELETE FROM run_events WHERE run_id IN ({run_ids});

-- name: delete_run_waits_of
DELETE FROM waits WHERE run_id IN ({run_ids});

-- name: delete_run_queue
DELETE FROM queue WHERE run_id IN ({run_ids});

-- name: delete_run_signals
DELETE FROM signals WHERE run_id IN ({run_ids});

-- Tables retention prunes by their own rule (rows.PruneTarget): each
-- prunable_<target> selects the keys of up to `limit` rows (a dry run counts
-- them), and prune_<target> deletes the same rows, {query:...} being that
-- select's text (one condition, written once).
-- name: prunable_events
-- Events received before the cutoff that no remaining run links to (a run's
-- events are received before it starts, so before it ends).
SELECT e.seq FROM events e
WHERE e.received_at < :before
  AND NOT EXISTS (SELECT 1 FROM run_events re WHERE re.event_seq = e.seq)
ORDER BY e.received_at
LIMIT :limit

-- name: freed_events
-- (a dry run: events before the cutoff that only runs prunable_runs chooses
-- link to, freed for prune_events once those runs are deleted)
SELECT COUNT(*) AS n FROM events e
WHERE e.received_at < :cutoff
  AND EXISTS (SELECT 1 FROM run_events re WHERE re.event_seq = e.seq)
  AND NOT EXISTS (SELECT 1 FROM run_events re
                  WHERE re.event_seq = e.seq AND re.run_id NOT IN ({query:prunable_runs}));

-- name: freed_functions
-- (a dry run: functions retired before the cutoff whose runs are all ones
-- prunable_runs chooses, freed for prune_functions once those are deleted)
SELECT COUNT(*) AS n FROM functions f
WHERE f.retired_at < :cutoff
  AND EXISTS (SELECT 1 FROM runs r WHERE r.function_id = f.id)
  AND NOT EXISTS (SELECT 1 FROM runs r
                  WHERE r.function_id = f.id AND r.id NOT IN ({query:prunable_runs}));

-- name: prune_events
DELETE FROM events WHERE seq IN ({query:prunable_events});

-- name: prunable_jobs
-- (an active job, queued or running, is never finished)
SELECT id FROM jobs WHERE finished_at < :before AND status NOT IN ({active}) LIMIT :limit

-- name: prune_jobs
DELETE FROM jobs WHERE id IN ({query:prunable_jobs});

-- name: prunable_crons
-- Schedules overdue since before the cutoff (a host advances its row as soon
-- as it is due) of a function retired since before it, or of none.
SELECT c.function_id, c.schedule FROM crons c
WHERE c.next_at < :before
  AND NOT EXISTS (SELECT 1 FROM functions f
                  WHERE f.id = c.function_id AND (f.retired_at IS NULL OR f.retired_at >= :before))
LIMIT :limit

-- name: prune_crons
DELETE FROM crons WHERE (function_id, schedule) IN ({query:prunable_crons});

-- name: prunable_functions
-- Retired (no deploy registers it) since before the cutoff, and no run of it is
-- left: a function any deploy hosts, or whose runs remain, is kept.
SELECT f.id FROM functions f
WHERE f.retired_at < :before
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.function_id = f.id)
LIMIT :limit

-- name: prune_functions
DELETE FROM functions WHERE id IN ({query:prunable_functions});

-- name: prunable_batches
-- (a pending batch's run exists: it is inserted with its row)
SELECT b.key FROM batches b WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = b.run_id) LIMIT :limit

-- name: prune_batches
DELETE FROM batches WHERE key IN ({query:prunable_batches});

-- name: prunable_debounces
SELECT d.key FROM debounces d WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = d.run_id) LIMIT :limit

-- name: prune_debounces
DELETE FROM debounces WHERE key IN ({query:prunable_debounces});

-- name: prunable_dedupe
SELECT key FROM dedupe WHERE expires_at <= :before LIMIT :limit

-- name: prune_dedupe
DELETE FROM dedupe WHERE key IN ({query:prunable_dedupe});

-- name: prunable_gcra
-- A cell whose theoretical arrival time is past acts as a missing one.
SELECT key FROM gcra WHERE tat < :before LIMIT :limit

-- name: prune_gcra
DELETE FROM gcra WHERE key IN ({query:prunable_gcra});

-- name: orphan_wait_keys
-- (PostgreSQL: locked, so a wait created meanwhile, whose upsert of its key
-- waits for this lock, either is seen by prune_wait_keys or re-inserts the key)
SELECT event_name, match_key FROM wait_keys k
WHERE NOT EXISTS (SELECT 1 FROM waits w
                  WHERE w.event_name = k.event_name AND w.match_key = k.match_key)
LIMIT :limit {lock};

-- name: prune_wait_key
DELETE FROM wait_keys AS k
WHERE event_name = :event_name AND match_key = :match_key
  AND NOT EXISTS (SELECT 1 FROM waits w
                  WHERE w.event_name = k.event_name AND w.match_key = k.match_key);
