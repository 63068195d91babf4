#!/usr/bin/env bash
# Installs the Debian 12 packages that tycho's build and tests need.
# Idempotent: when every package is already present it prints nothing and exits 0.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  liblua5.4-dev lua5.4
  libopenblas-dev libopenblas0-pthread libopenblas0-openmp
  libdnnl-dev
  libopenmpi-dev openmpi-bin
  libreadline-dev
  libpcre2-dev                 # host/text: the tokenizers' pre-tokenizer regular expressions
  libxml2-utils librsvg2-bin   # e2e.check_svg: xmllint reads, rsvg-convert renders check --svg's picture
  python3-venv python3-torch   # e2e.generate: transformers (pip, in a venv) over Debian's torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
