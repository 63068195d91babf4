-- A malformed plan: tycho check must refuse it with exit code 2 (a --set value of inf, parsed
-- by strtod, passed the range > 0).
-- expect: optimizer.lr = inf: must be a finite number
-- args: --set optimizer.lr=inf
return require "_base"
