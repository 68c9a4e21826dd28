# Sourced by scripts/setup.sh, test.sh, demo.sh and newcomer-check.sh (not run on its own).
#
# CLEF_CACHE_DIR (default ~/.cache/clef-router) holds everything the project downloads or builds outside the
# clone: the virtualenv, the Kafka broker jars (Maven's own repository is a temporary folder inside it) and,
# when CLEF_CACHE_DIR is set, pip's download cache and every tool cache that follows XDG_CACHE_HOME
# (torch, Hugging Face), so that an empty CLEF_CACHE_DIR plus the clone is all a run writes.
# Nothing here names a CLEF_* setting of the service; the service ignores CLEF_CACHE_DIR, CLEF_VENV, CLEF_DEBUG.

clef_cache="${CLEF_CACHE_DIR:-$HOME/.cache/clef-router}"
# torch's compiler caches default to /tmp/torchinductor_<user> (left behind after every run) and ~/.triton
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$clef_cache/torchinductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$clef_cache/triton}"
if [[ -n "${CLEF_CACHE_DIR:-}" ]]; then
    export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$clef_cache/pip}"
    export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$clef_cache/xdg}"
    export MPLCONFIGDIR="${MPLCONFIGDIR:-$clef_cache/matplotlib}"  # else ~/.config/matplotlib (bench tests)
fi

# stop_pids NAME=PID...: SIGTERM each process (newest first), wait up to 40 s for each, then SIGKILL.
# Every script that starts a background process records its pid and calls this from its EXIT trap.
stop_pids() {
    local entry name pid i
    for entry in "$@"; do
        name="${entry%%=*}"
        pid="${entry#*=}"
        [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || continue
        printf '[%s] stopping %s (pid %s)\n' "${0##*/}" "$name" "$pid" >&2
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 400; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            printf '[%s] %s did not stop within 40 s; killing it\n' "${0##*/}" "$name" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
}
