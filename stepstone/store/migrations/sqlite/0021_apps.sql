-- Apps served over HTTP (issue 16): one row per endpoint URL the server
-- registered (`stepstone apps sync URL`, `POST /api/v1/apps`). Its functions
-- live in `functions` under the app's name, each description carrying its
-- `serve_url`; `function_ids` (a sorted JSON list) is what the last sync found.
-- `error`/`error_at` describe the last failed sync (cleared by a good one).
-- One URL per app name, so a sync retiring the app's other functions never
-- touches another endpoint's.
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
CREATE UNIQUE INDEX apps_by_app ON apps (app);
