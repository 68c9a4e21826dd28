#!/usr/bin/env bash
# The project's test command (README, .ci/run): set-up if needed, then ruff, mypy --strict and
# pytest -m "not gpu" (unit tests and integration tests against a real local Apache Kafka broker), then
# (full runs only) the engine and conformance tests again under the newest transformers 5.x.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/env.sh
source "$repo/scripts/env.sh"
venv="$("$repo/scripts/setup.sh" | tail -n 1)"
export PATH="$venv/bin:$PATH"
# the tests' temporary files (pytest keeps its last runs' tmp_path folders) go to a folder removed at exit
test_tmp="$(mktemp -d -t clef-test-XXXXXX)"
trap 'rm -rf "$test_tmp"' EXIT
export TMPDIR="$test_tmp"

echo "== versions"
python -V
java -version 2>&1 | sed -n 1p
mvn -v 2>/dev/null | sed -n 1p
ruff --version
mypy --version
python -c 'import aiokafka, torch, transformers; print("aiokafka", aiokafka.__version__, "| torch", torch.__version__, "| transformers", transformers.__version__)'

newest_tests=(tests/unit/engine tests/conformance)

# every stage runs, so one report shows all problems; the script fails if any stage failed
failed=()

echo "== ruff check"
ruff check . || failed+=(ruff)

echo "== mypy --strict"
mypy --strict || failed+=(mypy)

echo "== pytest -m 'not gpu'"
# `timed` (scripts/env.sh) passes a Ctrl-C on to pytest and waits until it has ended, so its fixtures stop
# every broker they started before this script exits; then these traps run
trap 'echo "test.sh: interrupted" >&2; exit 130' INT
trap 'echo "test.sh: terminated" >&2; exit 143' TERM
rc=0
timed 3600 python -m pytest -m "not gpu" "$@" || rc=$?
case $rc in
    0) ;;
    5) echo "test.sh: pytest collected no tests; that is a failure" >&2; failed+=("pytest (no tests)") ;;
    124) echo "test.sh: pytest did not finish within 3600 s" >&2; failed+=("pytest (timeout)") ;;
    *) failed+=("pytest (exit $rc)") ;;
esac

# The engine and conformance tests again under the newest transformers 5.x (second venv, constraints-newest.txt);
# only on a full run (no pytest arguments), as CI does.
if (($# == 0)); then
    echo "== pytest under the newest transformers 5.x: ${newest_tests[*]}"
    newest="$("$repo/scripts/setup-newest.sh" | tail -n 1)"
    "$newest/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__)'
    rc=0
    timed 1800 "$newest/bin/python" -m pytest -m "not gpu" -p no:cacheprovider "${newest_tests[@]}" || rc=$?
    ((rc == 0)) || failed+=("pytest newest transformers (exit $rc)")
fi

if ((${#failed[@]})); then
    echo "test.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test.sh: all checks passed"
