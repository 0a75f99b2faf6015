-- A held run's end that expects to resolve nothing more than itself (no
-- parent's step.invoke waiting on it, no wait for the event its end
-- publishes, no concurrency slot to hand on) need not be read before its
-- COMMIT: BEGIN, the last memo, the end and COMMIT go out together (one round
-- trip). The end statement (end_alone in queries.sql) checks that guess on
-- the server and aborts the transaction when it was wrong; the store then
-- runs the end again the way that reads what it must resolve.
CREATE FUNCTION stepstone_end_alone(p_run_id TEXT, p_owner TEXT, p_fenced BOOLEAN, p_alone BOOLEAN)
RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_fenced THEN
        RAISE EXCEPTION 'run %: lease lost by %', p_run_id, p_owner USING ERRCODE = 'SS001';
    END IF;
    IF NOT p_alone THEN
        RAISE EXCEPTION 'run %: its end resolves more than itself', p_run_id USING ERRCODE = 'SS002';
    END IF;
    RETURN TRUE;
END
$$;
