-- Why a run was asked to cancel while a worker held it (an ErrorInfo as JSON,
-- or NULL for a plain cancel): the flag outlives the step it interrupts, and
-- the invocation that honours it (at a checkpoint, a park, or a later lease)
-- ends the run with this reason (a Timeout, a cancel_on event, a singleton).

ALTER TABLE queue ADD COLUMN cancel_reason TEXT;
