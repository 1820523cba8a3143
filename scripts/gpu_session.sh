#!/usr/bin/env bash
# Everything this project measures on a GPU, in one command that ends inside nine minutes on one
# H200 (a lent GPU's time is short: one prepared run, its numbers recorded in docs/benchmarks.md).
#   bash scripts/gpu_session.sh [OUT_DIR]     (default: $OUT, else /tmp/dgemma-gpu)
#   DGEMMA_SESSION_TOY=1 bash scripts/gpu_session.sh DIR   the suite's dry run: CPU, toy sizes
# Each part has its own time limit and writes OUT_DIR/<part>.txt, so a part that fails or runs
# long leaves the others' numbers; every figure is one JSON line, gathered in OUT_DIR/figures.jsonl.
# Needs CUDA, torch and transformers with DiffusionGemma (the dry run: a CPU).
set -u
out=${1:-${OUT:-/tmp/dgemma-gpu}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
toy=${DGEMMA_SESSION_TOY:-0}
started=$SECONDS

part() {  # part NAME SECONDS COMMAND...: run COMMAND under a limit, its output to OUT_DIR/NAME.txt
  local name=$1 limit=$2 began=$SECONDS
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  cat "$out/$name.txt"
  grep -h '^{' "$out/$name.txt" >>"$out/figures.jsonl"
  echo "{\"figure\": \"part\", \"part\": \"$name\", \"exit\": $rc, \"seconds\": $((SECONDS - began)), \"limit\": $limit}" | tee -a "$out/figures.jsonl"
}

: >"$out/figures.jsonl"
if [ "$toy" = 1 ]; then
  device=cpu
  full=(--device cpu --toy --dir "$out/config")
  rows=(--device cpu --vocab 4096 --canvas-length 16 --num-decode 2 --hidden 64 --impl reference chunked --baseline seed --repeats 1 --json)
  real=("${rows[@]}" --budget 1MiB)  # the real part's budget flag, at toy size (1 MiB: two tiles)
  scale=${DGEMMA_SESSION_SCALE:-4}  # a shared CPU: each part's limit four times the GPU's
else
  device=cuda
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  full=(--device cuda --dir "$out/config")
  # The issue's rows (vocab 262,144, CL 32, hidden 256) with the seed's step and the floor beside them.
  rows=(--device cuda --vocab 262144 --canvas-length 32 --num-decode 4 16 --hidden 256 --impl reference chunked --baseline seed --repeats 9 --json)
  # The released model's widths (CL 256, hidden 2,816), tiled against a 16 GiB cap.
  real=(--device cuda --vocab 262144 --canvas-length 256 --num-decode 16 32 --hidden 2816 --impl reference chunked --baseline seed --budget 16GiB --repeats 5 --json)
  scale=1
fi
# The installed versions, read from the packages' metadata (importing torch here would cost an interpreter's imports).
"$python" -c "import json, sys; from importlib.metadata import version; print(json.dumps({'figure': 'versions', 'python': sys.version.split()[0], 'torch': version('torch'), 'transformers': version('transformers'), 'device': '$device'}))" | tee -a "$out/figures.jsonl"

# The release at full depth, random weights, bf16: build, then the engine in both expert modes,
# eager and compiled, against transformers' generate; the lesson at the real free memory; the app.
part build $((60 * scale)) "$python" scripts/gpu_fullsize.py build "${full[@]}"
part engine $((150 * scale)) "$python" scripts/gpu_fullsize.py engine "${full[@]}"
part lesson $((60 * scale)) "$python" scripts/gpu_fullsize.py lesson "${full[@]}"
part app $((120 * scale)) "$python" scripts/gpu_fullsize.py app "${full[@]}"
# The decoder alone: experts per canvas, whole batch and the eager loop, one layer at the release's widths.
if [ "$toy" = 1 ]; then
  part decoder $((30 * scale)) "$python" -m dgemma.bench decoder --device cpu --experts 16 --top-k 2 --hidden 64 --moe-intermediate 32 \
    --intermediate 128 --heads 4 --head-dim 16 --vocab 1024 --canvas-length 16 --prompt-tokens 8 --canvases 2 --repeats 1 --json
else
  part decoder 45 "$python" -m dgemma.bench decoder --device cuda --canvases 4 32 --repeats 5 --json
fi
# Today's sampler rows (the step alone).
part sampler $((30 * scale)) "$python" -m dgemma.bench sampler "${rows[@]}"
part sampler-real $((45 * scale)) "$python" -m dgemma.bench sampler "${real[@]}"
echo "{\"figure\": \"session\", \"seconds\": $((SECONDS - started))}" | tee -a "$out/figures.jsonl"
