"""`/generate` gives the same texts whichever Python serves it.

Starts `python app.py` (the embedded model, or --model) under this interpreter and under each one
given, sends each the same prompts and seeds through the `generate` endpoint, and compares what
comes back: text, denoising steps and seed per prompt. One line per interpreter (its Python and
transformers versions, the call's time), then one line saying whether all agree; exit 1 if not.

    python scripts/same_texts.py ~/.cache/dgemma-pythons/py3.10/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dgemma.app_process import launch  # noqa: E402

PROMPTS = ["add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park", "sort 9 3 7 1", "repeat abc 3"]
SETTINGS = {"seed": 40, "max_new_tokens": 32}


def versions(python: str) -> str:
    code = "import sys, transformers, torch; print('%d.%d.%d' % sys.version_info[:3], transformers.__version__, torch.__version__)"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    py, transformers, torch = done.stdout.split()
    return f"Python {py} (transformers {transformers}, torch {torch})"


def texts(python: str, model_args: list[str], log_dir: Path) -> tuple[list[tuple], float]:
    from gradio_client import Client

    server = launch(model_args, log_dir / f"app-{abs(hash(python))}.log", timeout=300, python=python)
    try:
        started = time.monotonic()
        result = Client(server.url, verbose=False).predict(PROMPTS, SETTINGS, api_name="/generate")
        seconds = time.monotonic() - started
    finally:
        server.stop()
    return [(o["prompt"], o["text"], o["steps"], o["seed"]) for o in result["outputs"]], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pythons", nargs="+", help="interpreters to compare with this one (each with requirements.txt installed)")
    parser.add_argument("--model", help="checkpoint directory (default: the embedded model)")
    args = parser.parse_args(argv)
    model_args = ["--model", args.model] if args.model else []
    results = {}
    with tempfile.TemporaryDirectory() as log_dir:
        for python in [sys.executable, *args.pythons]:
            got, seconds = texts(python, model_args, Path(log_dir))
            results[python] = got
            print(f"{versions(python)}: {len(got)} texts in {seconds:.1f} s; first {got[0][0]!r} -> {got[0][1]!r}")
    reference = results[sys.executable]
    differ = [p for p, got in results.items() if got != reference]
    if differ:
        print(f"DIFFERENT texts under {', '.join(differ)} than under {sys.executable}")
        return 1
    print(f"same texts, steps and seeds for {len(PROMPTS)} prompts (seed {SETTINGS['seed']}) under {len(results)} interpreters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
