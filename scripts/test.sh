#!/usr/bin/env bash
# Set up and run the test suite on a fresh machine (this is the README's test command).
#   bash scripts/test.sh                 the whole suite, on two pytest-xdist workers
#   bash scripts/test.sh --fast          the fast tier (-m "not slow"): no process, server or browser
#   bash scripts/test.sh tests/test_x.py one file (any pytest arguments pass through)
set -euo pipefail
cd "$(dirname "$0")/.."
# The whole suite waits on servers, browsers and processes it starts: two workers, each handed
# whole modules (--dist loadfile keeps a module's server and browser on one worker), fill each
# other's waits; they take the modules in the order collected (tests/conftest.py puts the long
# ones first), not xdist's largest-first. The fast tier and a chosen file are compute alone,
# quicker in one process.
tier=(-n 2 --dist loadfile --no-loadscope-reorder)
if [[ "${1:-}" == "--fast" ]]; then
  shift
  tier=(-m "not slow")
elif [[ $# -gt 0 ]]; then
  tier=()
fi
source scripts/install_requirements.sh
install_into "$(python -c 'import sys; print(sys.executable)')"
# The browser tests drive Debian's chromium through playwright (`playwright install` cannot download here).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  fi
fi
python -m pytest -q "${tier[@]}" "$@"
