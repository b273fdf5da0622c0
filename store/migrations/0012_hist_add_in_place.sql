-- inferlog_hist_add adds into its first argument in place when that one
-- already covers the second's buckets, as the running state of
-- inferlog_merge soon does: PL/pgSQL changes an element of a local array
-- without copying it, so a row costs one pass over its own buckets instead
-- of a new array of the union and a pass over both. When the second reaches
-- past the first, the first grows to the union once. Same results; a
-- year's p99 per business line merges about 3 times faster
-- (docs/performance.md).
CREATE OR REPLACE FUNCTION inferlog_hist_add(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    a_len int;
    b_len int;
    lo int;
    hi int;
    shift int;
    grown bigint[];
BEGIN
    IF a IS NULL THEN RETURN b; END IF;
    IF b IS NULL THEN RETURN a; END IF;
    a_len := cardinality(a) - 2;
    b_len := cardinality(b) - 2;
    IF a_len < 0 OR b_len < 0 THEN
        RAISE EXCEPTION 'inferlog_hist_add: not a histogram: % or %', a, b;
    END IF;
    IF b_len = 0 THEN
        a[2] := a[2] + b[2];
        RETURN a;
    END IF;
    IF a_len = 0 THEN RETURN b[1:1] || (a[2] + b[2]) || b[3:]; END IF;
    lo := least(a[1], b[1]);
    hi := greatest(a[1] + a_len, b[1] + b_len);
    IF lo < a[1] OR hi > a[1] + a_len THEN
        grown := array_fill(0::bigint, ARRAY[hi - lo + 2]);
        grown[1] := lo;
        grown[2] := a[2];
        grown[a[1] - lo + 3 : a[1] - lo + 2 + a_len] := a[3:];
        a := grown;
    END IF;
    a[2] := a[2] + b[2];
    shift := b[1] - a[1] + 2;
    FOR i IN 1..b_len LOOP
        a[shift + i] := a[shift + i] + b[i + 2];
    END LOOP;
    RETURN a;
END
$$;
