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

# timed LIMIT CMD...: CMD under `timeout --signal=INT --kill-after=60 LIMIT`; returns CMD's status (124 when
# the limit ran out, 137 when it then had to be killed). `timeout` runs CMD in a process group of its own,
# where a Ctrl-C in the terminal does not reach it (a plain `timeout 3000 pip install ...` ignored Ctrl-C until
# pip was done): this waits for it in the background instead and passes a SIGINT or SIGTERM on to it (timeout
# forwards it to CMD). Once CMD has ended it restores the caller's INT and TERM traps and raises the signal
# again in the calling shell: the caller's own trap runs, or, without one, the shell ends by the signal after
# its EXIT trap, as it would have with CMD in its foreground. CMD's stdin is /dev/null.
timed() {
    local limit=$1 pid rc got="" saved
    shift
    saved="$(trap -p INT TERM)"
    timeout --signal=INT --kill-after=60 "$limit" "$@" &
    pid=$!
    trap 'got=INT; kill -INT "$pid" 2>/dev/null || true' INT
    trap 'got=TERM; kill -TERM "$pid" 2>/dev/null || true' TERM
    while :; do  # a trapped signal ends `wait` early: wait again until CMD has ended
        rc=0
        wait "$pid" || rc=$?
        kill -0 "$pid" 2>/dev/null || break
    done
    trap - INT TERM
    eval "$saved"
    if [[ -n "$got" ]]; then
        kill -s "$got" "$BASHPID"
        [[ "$got" == INT ]] && return 130
        return 143
    fi
    return "$rc"
}

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
