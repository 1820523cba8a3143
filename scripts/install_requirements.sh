# Sourced by scripts/test.sh and scripts/test_other_pythons.sh: the one way they install requirements-dev.txt.

install_into() {  # requirements-dev.txt into the environment of interpreter $1. With uv when the main
  # interpreter has it (requirements-dev.txt pins it: parallel downloads, one cache whose files every
  # environment links to, an up-to-date environment checked in 0.5 s where pip takes 8 s); with pip on
  # a fresh machine, where only pip is there, and where uv cannot (it reads no pip configuration).
  if python -m uv --version >/dev/null 2>&1 \
     && python -m uv pip install --quiet --compile-bytecode --python "$1" -r requirements-dev.txt; then
    return 0
  fi
  "$1" -m pip install -q -r requirements-dev.txt
}
