#!/usr/bin/env bash
# Bootstrap everything clef-router needs on a fresh Debian/Ubuntu machine, idempotently:
#   - Java 17+ and Maven (apt-get install when missing and running as root),
#   - a virtualenv outside the clone, keyed by a hash of pyproject.toml + constraints.txt
#     (${CLEF_CACHE_DIR:-~/.cache/clef-router}/venv-<hash>; override with CLEF_VENV), reused when present,
#   - the package installed editable from THIS clone with the dev extra and pinned torch/transformers,
#   - a second cached virtualenv with the newest transformers 5.x (scripts/setup-newest.sh),
#   - the Apache Kafka broker jars (Maven Central) in ${CLEF_CACHE_DIR:-~/.cache/clef-router}/kafka-<version>.
# Progress goes to stderr; the last line on stdout is the virtualenv path, e.g.
#   venv="$(scripts/setup.sh | tail -n 1)"
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf '[setup] %s\n' "$*" >&2; }

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing ${need_apt[*]} with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        timeout 900 apt-get update -qq >&2
        timeout 1800 apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
    else
        say "missing: ${need_apt[*]} (install them, e.g. sudo apt-get install ${need_apt[*]})"
        exit 1
    fi
fi
python3 - <<'PY' || { say "Python >= 3.11 is required (python3 is $(python3 -V 2>&1))"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

cache="${CLEF_CACHE_DIR:-$HOME/.cache/clef-router}"
key="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)"
venv="${CLEF_VENV:-$cache/venv-$key}"
mkdir -p "$cache"

if [[ ! -f "$venv/.clef-complete" ]]; then
    if [[ -z "${CLEF_VENV:-}" ]]; then
        rm -rf "$venv"  # ours, and incomplete (an interrupted install): start over
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        say "creating virtualenv $venv"
        python3 -m venv "$venv"
    fi
    timeout 600 "$venv/bin/python" -m pip install -q --upgrade pip >&2
    say "installing clef-router with its dependencies into $venv (torch is large; pip's cache makes reinstalls quick)"
    timeout 3000 "$venv/bin/python" -m pip install -q -c constraints.txt -e '.[dev]' >&2
    touch "$venv/.clef-complete"
else
    # same dependencies: only make sure the editable install points at this clone
    where="$("$venv/bin/python" -c 'import consumer, os; print(os.path.dirname(os.path.dirname(consumer.__file__)))' 2>/dev/null || true)"
    if [[ "$where" != "$repo" ]]; then
        say "pointing $venv at $repo"
        timeout 600 "$venv/bin/python" -m pip install -q --no-deps -c constraints.txt -e . >&2
    fi
fi

# Second environment: the newest transformers 5.x, for the engine and conformance tests (scripts/test.sh).
say "second virtualenv with the newest transformers 5.x (cached)"
"$repo/scripts/setup-newest.sh" >/dev/null

say "fetching the Kafka broker jars (cached)"
"$venv/bin/python" -m consumer.kafka_jars >&2
echo "$venv"
