#!/usr/bin/env bash
# The README's test command N times in a row on a clean clone of HEAD while two busy loops keep both
# cores occupied: a test that passes only on an idle machine shows here. Prints one line per run.
set -uo pipefail
runs=${1:-5}
top=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
dir=$(mktemp -d)
git clone -q "$top" "$dir/clone"
burn() { while :; do :; done; }
burn & b1=$!
burn & b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  (cd "$dir/clone" && bash scripts/test.sh -p no:cacheprovider) > "$dir/run$i.log" 2>&1
  rc=$?
  echo "run $i: exit $rc, $(( $(date +%s) - start )) s, $(tail -n 1 "$dir/run$i.log")"
done
echo "logs: $dir"
