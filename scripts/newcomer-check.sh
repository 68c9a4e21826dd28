#!/usr/bin/env bash
# The README's promise, checked as a newcomer would meet it: a fresh clone of this repository's HEAD, an
# empty CLEF_CACHE_DIR, an empty HOME and TMPDIR, then the README's two commands (scripts/demo.sh and
# scripts/test.sh). Passes when both succeed, HOME and TMPDIR are still empty afterwards (nothing was
# written outside the clone and CLEF_CACHE_DIR), and no process started by them is left.
#
#   scripts/newcomer-check.sh                 # the full check: downloads ~5 GB, takes a while
#   scripts/newcomer-check.sh tests/unit -x   # arguments go to scripts/test.sh (and so to pytest)
#
# Needs git, Python 3.11+, and Java + Maven (or root, for setup.sh's apt-get). Everything goes under one
# temporary folder (NEWCOMER_CHECK_DIR to choose it), removed at the end unless NEWCOMER_CHECK_KEEP=1.
# Both commands run with nothing of the caller's environment; NEWCOMER_CHECK_CLEF_ENV=1 passes the caller's
# CLEF_* variables through (all but CLEF_CACHE_DIR, which stays the empty one): a newcomer who exported the
# README's settings, CLEF_DEBUG=1 and CLEF_VENV included.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="${NEWCOMER_CHECK_DIR:-$(mktemp -d -t clef-newcomer-XXXXXX)}"
mark="$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
say() { printf '[newcomer-check] %s\n' "$*" >&2; }

marked_pids() {  # processes whose environment carries this run's marker (all descendants inherit it)
    local env_file pid
    for env_file in /proc/[0-9]*/environ; do
        pid="${env_file#/proc/}"
        pid="${pid%/environ}"
        [[ "$pid" != "$$" && "$pid" != "$BASHPID" ]] || continue
        tr '\0' '\n' 2>/dev/null <"$env_file" | grep -qx "NEWCOMER_CHECK_MARK=$mark" && echo "$pid"
    done
    return 0
}
run_pid=""
cleanup() {
    local rc=$? pid
    trap - INT TERM
    if [[ -n "$run_pid" ]] && kill -0 "$run_pid" 2>/dev/null; then
        kill -INT "$run_pid" 2>/dev/null || true
        wait "$run_pid" 2>/dev/null || true
    fi
    for pid in $(marked_pids); do  # only if something escaped its script's clean-up
        say "killing leftover process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)"
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [[ "${NEWCOMER_CHECK_KEEP:-}" == 1 ]]; then say "kept $root"; else rm -rf "$root"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$root/cache" "$root/home" "$root/tmp"
say "fresh clone of $(git -C "$repo" rev-parse --short HEAD) into $root/clone"
git clone --quiet --no-hardlinks "$repo" "$root/clone"
git -C "$root/clone" checkout --quiet --detach "$(git -C "$repo" rev-parse HEAD)"  # this HEAD, also from a worktree

# a newcomer's environment: nothing of ours set, except the cache folder the README mentions
clef_env=()
if [[ "${NEWCOMER_CHECK_CLEF_ENV:-0}" == 1 ]]; then
    while IFS= read -r name; do
        [[ "$name" == CLEF_CACHE_DIR ]] || clef_env+=("$name=${!name}")
    done < <(compgen -e | grep '^CLEF_' || true)
    say "passing ${#clef_env[@]} CLEF_* variables of the caller through"
fi
run_in_clone() {
    env -i PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" LANG=C.UTF-8 "${clef_env[@]}" \
        HOME="$root/home" TMPDIR="$root/tmp" CLEF_CACHE_DIR="$root/cache" NEWCOMER_CHECK_MARK="$mark" \
        bash -c 'cd "$1" && shift && exec "$@"' run "$root/clone" "$@" &
    run_pid=$!
    local rc=0
    wait "$run_pid" || rc=$?
    run_pid=""
    return "$rc"
}

failed=()
started=$(date +%s)
say "1/2 scripts/demo.sh (the first run sets up the virtualenv: about 5 GB)"
run_in_clone scripts/demo.sh || failed+=("scripts/demo.sh exited $?")
say "demo finished after $(($(date +%s) - started)) s"
say "2/2 scripts/test.sh $*"
run_in_clone scripts/test.sh "$@" || failed+=("scripts/test.sh exited $?")
say "both finished after $(($(date +%s) - started)) s; cache: $(du -sh "$root/cache" | cut -f1)"

left="$(marked_pids)"
[[ -z "$left" ]] || failed+=("processes left behind: $(echo "$left" | tr '\n' ' ')")
for dir in home tmp; do
    if [[ -n "$(find "$root/$dir" -mindepth 1 -print -quit)" ]]; then
        failed+=("written outside the clone and CLEF_CACHE_DIR, under \$${dir^^}: $(find "$root/$dir" -mindepth 1 -maxdepth 3 | head -n 5 | tr '\n' ' ')")
    fi
done

if ((${#failed[@]})); then
    for f in "${failed[@]}"; do say "FAILED: $f"; done
    exit 1
fi
say "passed: demo and tests green, nothing written outside the clone and CLEF_CACHE_DIR, no process left"
