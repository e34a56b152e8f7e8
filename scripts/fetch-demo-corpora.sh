#!/usr/bin/env bash
# Fetches the demo corpora: real English text from Debian packages (the King James Bible from
# bible-kjv, fortunes, the Jargon File from jargon-text, the GCIDE dictionary from dict-gcide),
# installing any that are missing, and converts each to jsonl documents in OUT_DIR (default
# demo/corpora): kjv.jsonl, fortunes.jsonl, jargon.jsonl, gcide.jsonl. See docs/data.md.
set -euo pipefail
out=${1:-demo/corpora}
"$(dirname "$0")/install-deps.sh" bible-kjv fortunes fortunes-min jargon-text dict-gcide dictzip
python3 "$(dirname "$0")/demo_corpora.py" "$out" "${@:2}"
