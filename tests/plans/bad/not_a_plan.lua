-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: the plan file returned a table not made by tycho.plan; it must end with return tycho.plan
return {
  model = {},
}
