#!/usr/bin/env bash
# Dev tool (not part of the product): put an earlier commit's Python packages into .carry/base/, so that one
# device call can run a bench on that code and on the working tree, same machine, back to back (the device
# copies the working tree without .git; .carry travels with it).
#
#   scripts/base-tree.sh 509f79d          # .carry/base/{engine,consumer,bench,schemas,devtools} of 509f79d
#   device tool: BENCH_TREE=.carry/base bash scripts/device-e2e.sh ...     (or device-engine.sh STEP...)
#
# Writes .carry/base/ only (replaced); about 1.4 MB.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit="${1:?usage: scripts/base-tree.sh COMMIT}"
base="$repo/.carry/base"
rm -rf "$base"
mkdir -p "$base"
git -C "$repo" archive "$commit" engine consumer bench schemas devtools | tar -x -C "$base"
git -C "$repo" rev-parse "$commit" >"$base/COMMIT"
echo "base-tree: $(cat "$base/COMMIT") in $base ($(du -sh "$base" | cut -f1))" >&2
