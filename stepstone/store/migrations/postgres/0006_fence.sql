-- A fence check that fails on the server. A checkpoint need not read its
-- result before going on, so BEGIN, the fence, the memo upserts and COMMIT go
-- out together (one round trip); a lost lease aborts the transaction.
CREATE FUNCTION stepstone_fence(p_run_id TEXT, p_owner TEXT, p_epoch BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    flag BIGINT;
BEGIN
    -- FOR SHARE: the lease cannot pass to another worker before this transaction ends.
    SELECT cancel_requested INTO flag FROM queue
    WHERE run_id = p_run_id AND owner = p_owner AND epoch = p_epoch FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run %: lease lost by %', p_run_id, p_owner USING ERRCODE = 'SS001';
    END IF;
    RETURN flag;
END
$$;
