#!/usr/bin/env bash
# Runs one crash plan that hits a limit under mpirun with 2 ranks and proves every rank stops at
# it together (the count is deterministic, so each rank's limit fires alike): the job ends within
# the timeout with exit code 2 and the plan's "-- expect:" message, never a hang.
# usage: check_mpi.sh MPIRUN TYCHO PLAN   (run from the source folder; PLAN relative to it)
set -u
mpirun=$1 tycho=$2 plan=$3
expect=$(grep -m1 -- '^-- expect: ' "$plan" | sed 's/^-- expect: //')
args=$(grep -m1 -- '^-- args: ' "$plan" | sed 's/^-- args: //')
# shellcheck disable=SC2086
stderr=$(timeout 60 "$mpirun" -np 2 "$tycho" run "$plan" $args 2>&1 >/dev/null)
rc=$?
fail() { echo "FAIL $plan under mpirun -np 2: $*"; echo "output was:"; printf '%s\n' "$stderr"; exit 1; }
[ "$rc" -eq 124 ] && fail "a hang (killed after 60 s)"
[ "$rc" -eq 2 ] || fail "exit code $rc, expected 2"
printf '%s\n' "$stderr" | grep -q "^tycho: plan error: .*$expect" || fail "no 'tycho: plan error: ... $expect' line"
echo "ok $plan under mpirun -np 2: $(printf '%s\n' "$stderr" | grep -m1 '^tycho: plan error')"
