"""`python -m dgemma.bench sampler|engine|load|recording`."""

from dgemma.bench import main
from dgemma.cli import run_cli

run_cli(main, prog="python -m dgemma.bench")
