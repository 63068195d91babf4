#!/bin/sh
# The layering of host/ and bindings/ (docs/design.md, "Folders"), checked on every build: each
# `#include "x/..."` of a file in folder F must name a folder x that F may include, as the table
# says. Every header is included as "folder/x.h" from host/, so the compiler's include path alone
# cannot stop a wrong-way include; this does, naming the file, the line and the arrow.
#
#   check-layering.sh ROOT TABLE
# ROOT: the source tree (host/ and bindings/ below it). TABLE: one line per folder, "folder: the
# folders it may include" (CMakeLists.txt writes it from the same lists that link the libraries).
# The table itself must have no cycle. Exit 0 when every include keeps to it, 1 (with one line per
# wrong include) when not, 2 on bad arguments.
set -u
root=${1:-}
table=${2:-}
if [ -z "$root" ] || [ -z "$table" ] || [ ! -d "$root/host" ] || [ ! -r "$table" ]; then
  echo "usage: check-layering.sh ROOT TABLE (ROOT holds host/; TABLE is readable)" >&2
  exit 2
fi

# The table's own cycles: repeatedly drop the folders whose allowed folders are all dropped; what
# is left lies on a cycle (or depends on one).
if ! awk -F: '
  { f = $1; gsub(/ /, "", f); folders[f] = 1; n = split($2, d, " "); deps[f] = ""
    for (i = 1; i <= n; i++) deps[f] = deps[f] " " d[i] }
  END {
    do { changed = 0
      for (f in folders) { if (done[f]) continue
        n = split(deps[f], d, " "); ok = 1
        for (i = 1; i <= n; i++) if (!done[d[i]] && (d[i] in folders)) ok = 0
        if (ok) { done[f] = 1; changed = 1 } }
    } while (changed)
    bad = ""
    for (f in folders) if (!done[f]) bad = bad " " f
    if (bad != "") { print "layering: the table has a cycle among:" bad > "/dev/stderr"; exit 1 }
  }' "$table"; then
  exit 1
fi

status=0
tmp=${TMPDIR:-/tmp}/tycho-layering.$$
trap 'rm -f "$tmp"' EXIT INT TERM
# every source file with its folder (bindings/ is the folder "bindings"; host/main.c is "main")
find "$root/host" "$root/bindings" -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null | sort > "$tmp"
while IFS= read -r file; do
  rel=${file#"$root"/}
  case $rel in
    host/main.c) folder=main ;;
    host/*/*) folder=${rel#host/}; folder=${folder%%/*} ;;
    bindings/*) folder=bindings ;;
    *) continue ;;
  esac
  # "x/..." names folder x; a bare name outside bindings/ that is a bindings header names bindings
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' "$file" | while IFS= read -r hit; do
    line=${hit%%:*}
    inc=${hit#*\"}; inc=${inc%%\"*}
    case $inc in
      */*) to=${inc%%/*} ;;
      *) if [ "$folder" != bindings ] && [ -f "$root/bindings/$inc" ] && [ ! -f "$(dirname "$file")/$inc" ]; then
           to=bindings
         else
           continue
         fi ;;
    esac
    [ "$to" = "$folder" ] && continue
    # only folders of the table count (kernels' headers, "readline/..." and the like do not)
    grep -q "^$to:" "$table" || continue
    allowed=$(sed -n "s/^$folder:[[:space:]]*//p" "$table")
    case " $allowed " in
      *" $to "*) ;;
      *) echo "$rel:$line: wrong-way include \"$inc\": $folder -> $to (${folder} may include: ${allowed:-nothing})" ;;
    esac
  done
done < "$tmp" > "$tmp.out"
if [ -s "$tmp.out" ]; then
  cat "$tmp.out" >&2
  echo "layering: $(wc -l < "$tmp.out" | tr -d ' ') wrong-way include(s); the table is in CMakeLists.txt (TYCHO_LAYERS)" >&2
  status=1
fi
rm -f "$tmp.out"
exit $status
