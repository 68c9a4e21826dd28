#!/usr/bin/env bash
# The second, cached virtualenv in which scripts/test.sh runs the engine and conformance tests again: the
# same package and dev extra as scripts/setup.sh, but with the newest transformers 5.x (constraints-newest.txt)
# instead of the pinned one. ${CLEF_CACHE_DIR:-~/.cache/clef-router}/venv-newest-<hash of pyproject.toml +
# constraints-newest.txt>, reused while those are unchanged. Progress goes to stderr; the last line on stdout
# is the virtualenv path. Assumes what scripts/setup.sh checks (python3 >= 3.11 with venv).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf '[setup-newest] %s\n' "$*" >&2; }

# shellcheck source=scripts/env.sh
source "$repo/scripts/env.sh"
cache="$clef_cache"
key="$(cat pyproject.toml constraints-newest.txt | sha256sum | cut -c1-12)"
venv="$cache/venv-newest-$key"
mkdir -p "$cache"

if [[ ! -f "$venv/.clef-complete" ]]; then
    rm -rf "$venv"  # incomplete (an interrupted install): start over
    say "creating virtualenv $venv (transformers per constraints-newest.txt)"
    python3 -m venv "$venv"
    timed 600 "$venv/bin/python" -m pip install -q --upgrade pip >&2
    say "first run: about 5 GB more to install (pip's download cache makes it quicker after setup.sh)"
    timed 3000 "$venv/bin/python" -m pip install --progress-bar off -c constraints-newest.txt -e '.[dev]' >&2
    touch "$venv/.clef-complete"
else
    where="$("$venv/bin/python" -c 'import consumer, os; print(os.path.dirname(os.path.dirname(consumer.__file__)))' 2>/dev/null || true)"
    if [[ "$where" != "$repo" ]]; then
        say "pointing $venv at $repo"
        timed 600 "$venv/bin/python" -m pip install -q --no-deps -c constraints-newest.txt -e . >&2
    fi
fi
echo "$venv"
