-- Retired functions: when an app's worker registers its functions, those the
-- app registered before and no longer has get retired_at. Events stop starting
-- runs of them (the catalog leaves them out); workers still running the old
-- code drain the runs they host; registering one again clears retired_at.
ALTER TABLE functions ADD COLUMN retired_at REAL;
