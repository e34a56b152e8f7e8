#!/usr/bin/env bash
# Fetches the demo corpora: real English text from Debian packages (the King James Bible from
# bible-kjv, fortunes, the Jargon File from jargon-text, the GCIDE dictionary from dict-gcide),
# installing any that are missing, and converts each to jsonl documents in OUT_DIR (default
# demo/corpora): kjv.jsonl, fortunes.jsonl, jargon.jsonl, gcide.jsonl. See docs/data.md.
set -euo pipefail
out=${1:-demo/corpora}
packages=(bible-kjv fortunes fortunes-min jargon-text dict-gcide dictzip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fetch-demo-corpora: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python3 "$(dirname "$0")/demo_corpora.py" "$out" "${@:2}"
