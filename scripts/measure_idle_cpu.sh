#!/usr/bin/env bash
# An idle app's CPU: `python app.py` started, ready, left alone 5 s, then its CPU (utime + stime from
# /proc/PID/stat, read from outside) over 30 s; app.py as it is against app.py at BASELINE_REV,
# alternately, ROUNDS times (docs/measurements/idle-app-cpu-2026-12-03.txt: BASELINE_REV 7f0a057,
# before QUEUE_POLL_S).   bash scripts/measure_idle_cpu.sh BASELINE_REV [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=app_at_${1:?a git revision to compare app.py against}.py
rounds=${2:-2}
git show "$1:app.py" > "$baseline"  # beside app.py: it finds assets/ and dgemma/ from its own folder
trap 'rm -f "$baseline"' EXIT
port=7990
for round in $(seq "$rounds"); do
  for variant in "$baseline" app.py; do
    port=$((port + 1))
    python "$variant" --host 127.0.0.1 --port "$port" > "/tmp/idle-$port.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do grep -q "ready at" "/tmp/idle-$port.log" && break; sleep 1; done
    sleep 5
    a=$(awk '{print $14 + $15}' "/proc/$pid/stat"); sleep 30; b=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    echo "round $round $variant: $((b - a)) ticks of CPU in 30 s idle = $(python -c "print(round(($b - $a) / $(getconf CLK_TCK) / 30 * 100, 1))") % of a core"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
