#!/usr/bin/env bash
# Bootstrap everything clef-router needs on a fresh Debian/Ubuntu machine, idempotently:
#   - Java 17+ and Maven (apt-get install when missing and running as root),
#   - a virtualenv outside the clone, keyed by a hash of pyproject.toml + constraints.txt
#     (${CLEF_CACHE_DIR:-~/.cache/clef-router}/venv-<hash>), reused when present,
#   - the package installed editable from THIS clone with the dev extra and pinned torch/transformers,
#   - or, with CLEF_VENV=<a virtualenv of your own that exists>: only what it lacks is installed (at the pinned
#     versions), this clone is linked into it, and no package already there is upgraded or downgraded: when
#     the dependencies need a change to one, it says which and why and stops, changing nothing
#     (devtools/venv_plan.py); pip itself is left as it is,
#   - the Apache Kafka broker jars (Maven Central) in ${CLEF_CACHE_DIR:-~/.cache/clef-router}/kafka-<version>.
# The first run downloads and installs about 5 GB (torch with its CUDA libraries is most of it) and takes
# several minutes; later runs reuse everything and take a second or two.
# Progress goes to stderr; the last line on stdout is the virtualenv path, e.g.
#   venv="$(scripts/setup.sh | tail -n 1)"
# and the last line on stderr says how to put `clef-router` on PATH: source <venv>/bin/activate
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/env.sh
source "$repo/scripts/env.sh"
say() { printf '[setup] %s\n' "$*" >&2; }

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing ${need_apt[*]} with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        timed 900 apt-get update -qq >&2
        timed 1800 apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
    else
        say "missing: ${need_apt[*]} (install them, e.g. sudo apt-get install ${need_apt[*]})"
        exit 1
    fi
fi
python3 - <<'PY' || { say "Python >= 3.11 is required (python3 is $(python3 -V 2>&1))"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

# with_ticker MESSAGE CMD...: run CMD, saying MESSAGE with the elapsed time and the virtualenv's size every
# 30 s (pip prints nothing while it unpacks and installs torch's gigabytes); the ticker is stopped by pid
ticker_pid=""
plan_dir=""
trap '[[ -z "$ticker_pid" ]] || kill "$ticker_pid" 2>/dev/null || true; [[ -z "$plan_dir" ]] || rm -rf "$plan_dir"' EXIT
with_ticker() {
    local message="$1" began=$SECONDS rc=0
    shift
    (
        nap=""
        trap '[[ -z "$nap" ]] || kill "$nap" 2>/dev/null; exit 0' TERM  # its sleep must not outlive it
        while :; do
            sleep 30 &
            nap=$!
            wait "$nap"
            say "$message: $((SECONDS - began)) s, $(du -sh "$venv" 2>/dev/null | cut -f1) so far"
        done
    ) &
    ticker_pid=$!
    "$@" || rc=$?
    kill "$ticker_pid" 2>/dev/null || true
    wait "$ticker_pid" 2>/dev/null || true
    ticker_pid=""
    return "$rc"
}

# ---- the project's virtualenv ---------------------------------------------------------------------------
cache="$clef_cache"
key="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)"
venv="${CLEF_VENV:-$cache/venv-$key}"
mkdir -p "$cache"

# sync_user_venv: CLEF_VENV names an existing virtualenv of the user's: install what it lacks, link this
# clone, change nothing that is there (see the header); marks it with this set-up's key when done
sync_user_venv() {
    local rc=0
    plan_dir="$(mktemp -d -t clef-setup-XXXXXX)"
    say "CLEF_VENV=$venv: checking what it lacks (installed packages are kept as they are)"
    "$venv/bin/python" - >"$plan_dir/installed.json" <<'PY'
import importlib.metadata as metadata, json
found = {}
for dist in metadata.distributions():  # the first on sys.path is the one that imports
    found.setdefault(dist.metadata["Name"], dist.version)
print(json.dumps(found))
PY
    python3 devtools/venv_plan.py constraints "$plan_dir/installed.json" constraints.txt >"$plan_dir/constraints.txt"
    timed 900 "$venv/bin/python" -m pip install -q --dry-run --report "$plan_dir/report.json" \
        -c "$plan_dir/constraints.txt" -e '.[dev]' >&2 \
        || { say "pip could not work out what $venv lacks (pip >= 22.2 is needed for --report)"; exit 1; }
    python3 devtools/venv_plan.py plan "$plan_dir/installed.json" "$plan_dir/report.json" clef-router \
        >"$plan_dir/install.txt" || rc=$?
    if ((rc != 0)); then
        say "CLEF_VENV=$venv: these installed packages would have to change (nothing was changed):"
        say "change them yourself, or unset CLEF_VENV to use the project's own virtualenv"
        exit 1
    fi
    if [[ -s "$plan_dir/install.txt" ]]; then
        say "installing $(wc -l <"$plan_dir/install.txt") missing packages into $venv"
        with_ticker "still installing" timed 3000 "$venv/bin/python" -m pip install --no-deps \
            -r "$plan_dir/install.txt" >&2
    else
        say "nothing missing"
    fi
    say "linking $venv to $repo (editable clef-router, no dependencies touched)"
    timed 600 "$venv/bin/python" -m pip install -q --no-deps -e . >&2
    echo "$key" >"$venv/.clef-complete"
}

if [[ -n "${CLEF_VENV:-}" && -x "$venv/bin/python" && "$(cat "$venv/.clef-complete" 2>/dev/null)" != "$key" ]]; then
    sync_user_venv
elif [[ ! -f "$venv/.clef-complete" ]]; then
    if [[ -z "${CLEF_VENV:-}" ]]; then
        rm -rf "$venv"  # ours, and incomplete (an interrupted install): start over
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        say "creating virtualenv $venv"
        python3 -m venv "$venv"
    fi
    say "upgrading pip"
    timed 600 "$venv/bin/python" -m pip install -q --upgrade pip >&2
    say "installing clef-router with its dependencies into $venv"
    say "first run: about 5 GB to download and install (torch and its CUDA libraries), several minutes;"
    say "pip lists each package as it goes (its download cache: ${PIP_CACHE_DIR:-~/.cache/pip})"
    # no -q: pip's per-package lines (Collecting/Downloading/Installing) are the progress
    with_ticker "still installing" timed 3000 "$venv/bin/python" -m pip install -c constraints.txt -e '.[dev]' >&2
    touch "$venv/.clef-complete"
else
    # same dependencies: only make sure the editable install points at this clone
    where="$("$venv/bin/python" -c 'import consumer, os; print(os.path.dirname(os.path.dirname(consumer.__file__)))' 2>/dev/null || true)"
    if [[ "$where" != "$repo" ]]; then
        say "pointing $venv at $repo"
        timed 600 "$venv/bin/python" -m pip install -q --no-deps -c constraints.txt -e . >&2
    fi
fi

# ---- the Apache Kafka broker jars ---------------------------------------------------------------------
say "Kafka broker jars (fetched once with Maven, about 45 MB):"
"$venv/bin/python" -m devtools.kafka_jars >&2

say "ready. To use clef-router in this shell:  source $venv/bin/activate"
echo "$venv"
