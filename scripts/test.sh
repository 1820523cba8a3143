#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine (this is the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -r requirements-dev.txt
# The browser tests drive Debian's chromium through playwright (`playwright install` cannot download here).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  fi
fi
python -m pytest -q "$@"
