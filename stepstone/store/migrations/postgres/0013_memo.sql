-- What each step call did (the function a step.run called, the event a wait
-- waited for, the function invoked), so a replay never hands a memo to a call
-- that does not match it (a repeated id whose suffixes a deploy shifted).
ALTER TABLE steps ADD COLUMN fingerprint TEXT;
