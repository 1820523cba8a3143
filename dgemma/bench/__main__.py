from dgemma.bench import main
from dgemma.cli import run_cli

run_cli(main)
