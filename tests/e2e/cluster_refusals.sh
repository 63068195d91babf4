#!/usr/bin/env bash
# A cluster file (--cluster) whose number is infinite or not positive is refused with exit 2,
# naming the file, the line and the field (inf passed the positivity check before); an __index
# that raises or never returns is a message too.
# usage: cluster_refusals.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
refused() { # refused BEFORE TEXT SED: the cluster file edited by SED is refused with exit 2, its
  # message holding the file's path, then BEFORE, then TEXT
  sed "$3" plans/clusters/h100_80g_ib.lua >"$tmp/c.lua"
  local err rc
  err=$("$tycho" check plans/tiny.lua --cluster "$tmp/c.lua" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: $3: exit $rc, expected 2 ($err)"; exit 1; }
  case "$err" in
    *"$tmp/c.lua:$1"*"$2"*) ;;
    *) echo "FAIL: $3: '$err' lacks '$1' ... '$2'"; exit 1 ;;
  esac
}
expect() { refused "" "$1: must be a positive, finite number" "$2"; }
expect inter_node.bandwidth_gbs 's/bandwidth_gbs = 50,/bandwidth_gbs = math.huge,/'
expect peak_tflops 's/peak_tflops = 989,/peak_tflops = -math.huge,/'
expect device_memory_gb 's/device_memory_gb = 80,/device_memory_gb = 0,/'
# Read under a protected call: a "strict table" __index that raises, or one that loops into the
# instruction limit, is a message with exit 2 (it was a Lua panic: exit 134, nothing printed).
panics() { refused " reading the cluster file: " "$1" "$2"; }
panics "no cluster field efficiency" \
  's/^return {/return setmetatable({/; s/^  efficiency = .*//; s/^}/}, { __index = function(_, k) error("no cluster field " .. k) end })/'
panics "instruction limit" \
  's/^return {/return setmetatable({/; s/^  efficiency = .*//; s/^}/}, { __index = function() while true do end end })/'
"$tycho" check plans/tiny.lua --cluster plans/clusters/h100_80g_ib.lua >/dev/null || { echo "FAIL: the shipped cluster file"; exit 1; }
echo "ok: cluster refusals"
