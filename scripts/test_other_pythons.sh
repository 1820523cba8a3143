#!/usr/bin/env bash
# The fast subset (-m "not slow") and the ZeroGPU simulation (tests/test_zerogpu.py) on every
# CPython 3.10-3.13 on this machine other than the one `python` runs (scripts/test.sh runs the
# whole suite on that one). An interpreter is found as a pyenv version ($PYENV_ROOT/versions/3.X.*)
# or as `python3.X` on PATH; each gets its own virtual environment under $DGEMMA_PYTHONS_DIR
# (default ~/.cache/dgemma-pythons), made once and brought up to requirements-dev.txt on every
# run (by uv when the main interpreter has it, else pip). Ends with one line naming the
# interpreters run and those skipped (and why); exits non-zero when any run failed (its
# requirements did not install, a test failed, or no test ran).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/install_requirements.sh

ROOT_DIR="${DGEMMA_PYTHONS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dgemma-pythons}"
MAIN="$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
ran=() skipped=() failed=()

version_of() {  # "3.X.Y" of an interpreter, or nothing when it does not run
  "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}

find_python() {  # an interpreter of minor version $1 (e.g. 3.10), newest pyenv patch first, else PATH
  local candidate
  for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".* 2>/dev/null | sort -rV); do
    if [[ "$(version_of "$candidate/bin/python")" == "$1".* ]]; then echo "$candidate/bin/python"; return; fi
  done
  candidate="$(command -v "python$1" 2>/dev/null)" || return
  if [[ "$(version_of "$candidate")" == "$1".* ]]; then echo "$candidate"; fi  # a pyenv shim may not run
}

compile_once() {  # the bytecode of every package in the environment of $1, once (marked by a file)
  # uv compiles only what it installs, and under PYTHONDONTWRITEBYTECODE (set on the machines this suite is
  # measured on) Python caches nothing: without this an environment made before the install above
  # compiled would compile torch, transformers and gradio from source in every process (an
  # import of the three: 35 s against 17 s on 3.12). A new environment is marked when it is made.
  # Some files in site-packages are not Python 3.X (templates, vendored Python 2): compileall
  # reports them and goes on.
  local marker="$(dirname "$(dirname "$1")")/.bytecode-compiled"
  if [[ ! -e "$marker" ]]; then
    "$1" -m compileall -q -j 0 "$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1
    touch "$marker"
  fi
}

run_on() {  # $1: minor version, $2: interpreter; sets ran/failed
  local minor=$1 python=$2 venv="$ROOT_DIR/py$1" log="$ROOT_DIR/py$1.log" full started rc=0
  full="$(version_of "$python")"
  started=$SECONDS
  mkdir -p "$ROOT_DIR"
  if [[ ! -x "$venv/bin/python" ]]; then
    if ! "$python" -m venv "$venv" >"$log" 2>&1; then
      skipped+=("$full (no venv module: $(tail -n 1 "$log"))"); return
    fi
    touch "$venv/.bytecode-compiled"  # a new environment: the install below compiles all it puts there
  fi
  echo "== Python $full: installing requirements-dev.txt into $venv"
  if ! install_into "$venv/bin/python" >"$log" 2>&1; then
    grep -E "^ERROR" "$log" | head -n 5
    failed+=("$full (requirements did not install, see $log)"); ran+=("$full: install failed"); return
  fi
  compile_once "$venv/bin/python"
  # The ZeroGPU simulation runs beside the fast subset: it mostly waits on its app and spaces'
  # worker processes while the fast subset computes. Its output follows the fast subset's.
  echo "== Python $full: the fast subset, the ZeroGPU simulation beside it"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_zerogpu.py >"$ROOT_DIR/py$1-zerogpu.log" 2>&1 &
  local simulation=$!
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" || rc=$?
  local fast=$rc
  rc=0
  wait "$simulation" || rc=$?
  echo "== Python $full: the ZeroGPU simulation"
  cat "$ROOT_DIR/py$1-zerogpu.log"
  local seconds=$((SECONDS - started))
  if [[ $fast -ne 0 || $rc -ne 0 ]]; then
    failed+=("$full (pytest exit $fast and $rc)"); ran+=("$full: FAILED in ${seconds} s")
  else
    ran+=("$full: passed in ${seconds} s")
  fi
}

for minor in 3.10 3.11 3.12 3.13; do
  if [[ "$minor" == "$MAIN" ]]; then continue; fi
  python_path="$(find_python "$minor")"
  if [[ -z "$python_path" ]]; then skipped+=("$minor (not installed)"); continue; fi
  run_on "$minor" "$python_path"
done

join() { local IFS=";"; echo "${*:-none}" | sed 's/;/; /g'; }
echo "Other Pythons (the fast subset and the ZeroGPU simulation; the whole suite ran on $MAIN): ran $(join "${ran[@]}"); skipped $(join "${skipped[@]}")."
[[ ${#failed[@]} -eq 0 ]]
