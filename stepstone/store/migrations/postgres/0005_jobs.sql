-- PostgreSQL dialect of sqlite/0005_jobs.sql (same statements, PostgreSQL types).
-- Background operator jobs (bulk cancel / replay started over HTTP). A job
-- that is queued or running refreshes updated_at while it works; one whose
-- updated_at is stale was interrupted (its server died) and is marked so.

CREATE TABLE jobs (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    status       TEXT NOT NULL,
    params       TEXT NOT NULL,
    done         BIGINT NOT NULL DEFAULT 0,
    examined     BIGINT NOT NULL DEFAULT 0,
    error        TEXT,
    owner        TEXT,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    finished_at  DOUBLE PRECISION
);
CREATE INDEX jobs_by_status ON jobs (status, updated_at);
