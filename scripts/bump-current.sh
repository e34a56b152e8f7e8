#!/usr/bin/env bash
# Bumps the "current" test environment to today's releases: resolves, for Debian's python3, the
# newest release of each package of the first block of scripts/requirements-current.txt (what the
# tests use) and rewrites the file with the new pins and every dependency they pull. Nothing is
# installed (pip --dry-run in a scratch venv; megatron-core on its own, see the file). Then run
# `make test` (setup-current.sh builds the new environment, its key having changed) and commit the
# file together with the fixes for what the new releases broke.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
file=$repo/scripts/requirements-current.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip -q --disable-pip-version-check install --dry-run --ignore-installed)
mapfile -t top < <(sed -n '/^# What the tests use:/,/^#$/p' "$file" | sed -n 's/==.*//p')
others=()
for name in "${top[@]}"; do [ "$name" = megatron-core ] || others+=("$name"); done
"${pip[@]}" --report "$work/resolved.json" "${others[@]}"
"${pip[@]}" --report "$work/megatron.json" --no-deps --ignore-requires-python --only-binary=:all: megatron-core
/usr/bin/python3 - "$file" "$work/resolved.json" "$work/megatron.json" <<'PYTHON'
import datetime, json, re, sys

path, resolved, megatron = sys.argv[1:]


def pins(report):
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in json.load(open(report))["install"]}


versions = pins(resolved) | pins(megatron)
# The file is: comments ending "# What the tests use:", its pins, comments, the other pins.
blocks = []
for line in open(path).read().splitlines():
    comment = line.startswith("#") or not line
    if not blocks or blocks[-1][0] != comment:
        blocks.append((comment, []))
    blocks[-1][1].append(line)
(_, header), (_, top), (_, notes) = blocks[:3]
names = [line.split("==")[0].lower().replace("_", "-") for line in top]
header = [re.sub(r"on \d{4}-\d{2}-\d{2}\.", f"on {datetime.date.today()}.", line) for line in header]
lines = header + [f"{n}=={versions[n]}" for n in names] + notes
lines += [f"{n}=={versions[n]}" for n in sorted(versions) if n not in names]
open(path, "w").write("\n".join(lines) + "\n")
for n in names:
    print(f"bump-current: {n}=={versions[n]}")
PYTHON
