"""`python -m dgemma.bench sampler|engine|load|soak|recording|hostile|frames|lesson|decoder|page`."""

from dgemma.bench import main
from dgemma.cli import run_cli

run_cli(main, prog="python -m dgemma.bench")
