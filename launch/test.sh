#!/usr/bin/env bash
# Set up the machine (launch/setup.sh) and run the whole test suite.
# This is the README's test command and exactly what CI runs (.ci/run).
# It lints (`ruff check`, configured in pyproject.toml), then runs pytest on RETERM_TEST_WORKERS
# processes (default 2, pytest-xdist; the Docker tests share one of them: tests/conftest.py).
# Extra arguments go to pytest, e.g. `bash launch/test.sh -m "not docker"`, or `-n 0` for one process.
set -euo pipefail
cd "$(dirname "$0")/.."

# runsc too (best effort): its tests run where gVisor works and skip, saying why, where it does not
RETERM_RUNSC=${RETERM_RUNSC:-try} bash launch/setup.sh
echo "== pip install -r requirements-dev.txt"
python3 -m pip install -q -r requirements-dev.txt

echo "== ruff check"
python3 -m ruff check .

set +e
echo "== pytest"
python3 -m pytest -q --timeout=1200 -n "${RETERM_TEST_WORKERS:-2}" --dist loadgroup "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests. This project always has tests, so an empty
# run means collection is broken (a bad -k/-m filter or an import-time skip): fail loudly.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests; refusing to report success" >&2
  exit 1
fi
exit "$rc"
