#!/usr/bin/env bash
# Everything this project measures on a GPU, in one command that ends inside ten minutes (a lent
# GPU's time is short: one prepared run, its numbers recorded in docs/benchmarks.md).
#   bash scripts/gpu_session.sh [OUT_DIR]     (default: $OUT, else /tmp/dgemma-gpu)
# Each part has its own time limit and writes OUT_DIR/<part>.txt, so a part that fails or runs
# long leaves the others' numbers. Needs CUDA, torch and transformers with DiffusionGemma.
set -u
out=${1:-${OUT:-/tmp/dgemma-gpu}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}

part() {  # part NAME SECONDS COMMAND...: run COMMAND under a limit, its output to OUT_DIR/NAME.txt
  local name=$1 limit=$2 started=$SECONDS
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  cat "$out/$name.txt"
  echo "== $name: exit $rc after $((SECONDS - started)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$python" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"

# The issue's rows (vocab 262,144, CL 32, hidden 256) with the seed's step and the floor beside them.
rows=(--device cuda --vocab 262144 --canvas-length 32 --num-decode 4 16 --hidden 256 --impl reference chunked --baseline seed --repeats 9)
part sampler 90 "$python" -m dgemma.bench sampler "${rows[@]}"
part sampler-greedy 90 "$python" -m dgemma.bench sampler "${rows[@]}" --greedy
# The released model's widths (CL 256, hidden 2,816), tiled against a 16 GiB cap.
real=(--device cuda --vocab 262144 --canvas-length 256 --num-decode 16 32 --hidden 2816 --impl reference chunked --baseline seed --budget 16GiB --repeats 5)
part sampler-real 120 "$python" -m dgemma.bench sampler "${real[@]}"
part sampler-real-greedy 120 "$python" -m dgemma.bench sampler "${real[@]}" --greedy
# A random-weight two-layer model of the release's widths: load, sampler memory, tile size, engine vs generate.
part gpu-check 150 "$python" scripts/gpu_check.py --dir /tmp
