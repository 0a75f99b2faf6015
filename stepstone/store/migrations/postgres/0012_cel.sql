-- Wait index values now write every number as CEL compares it (waits.index_value):
-- an integral one as an integer, so 1.0 is indexed as 1 (and -0.0 as 0). Rewrite
-- the index values of waits parked by earlier versions the same way, so that they
-- still match. Only scalar numbers in plain decimal form ('1.0', '-3.0'): values
-- inside lists or objects, and integers beyond 2**53, keep their old text.
UPDATE waits
SET match_value = CASE WHEN match_value = '-0.0' THEN '0'
                       ELSE substr(match_value, 1, length(match_value) - 2) END
WHERE match_key <> '' AND match_value LIKE '%.0'
  AND substr(match_value, 1, 1) NOT IN ('"', '[', '{')
  AND match_value NOT LIKE '%e%' AND match_value NOT LIKE '%E%';
