-- Retention (issue 17): ended runs are found oldest first by when they ended,
-- and `stepstone stats` reads the oldest one.
CREATE INDEX runs_by_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;
