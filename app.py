"""dgemma demo: `python app.py` serves the app on the embedded model at http://127.0.0.1:7860.

Thin on purpose: flags -> backend (model + engine) -> Blocks -> launch with the queue.
The model path comes only from here (the command line), never from the UI or the API.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# Gradio's usage analytics would phone home from a teaching laptop or a Space: off by default.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from dgemma.cli import ArgumentParser, positive_int  # noqa: E402  (after the environment is set)


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


def _size(text: str) -> str:
    from dgemma.memory import parse_size

    try:
        parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


# On a Space nobody passes flags: these variables stand in for them (a flag given still wins).
# HF_TOKEN is read by huggingface_hub itself, for gated checkpoints.
ENV_FLAGS = {
    "DGEMMA_MODEL": "--model", "DGEMMA_DEVICE": "--device", "DGEMMA_DTYPE": "--dtype",
    "DGEMMA_MAX_NUM_SEQS": "--max-num-seqs", "DGEMMA_MEMORY_BUDGET": "--memory-budget",
}  # fmt: skip


def _env_args(argv: list[str]) -> dict[str, str]:
    """`--flag=value` for each variable set whose flag is absent from argv, keyed by the variable."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    extra = {}
    for name, flag in ENV_FLAGS.items():
        value = os.environ.get(name, "").strip()
        if value and flag not in given:
            extra[name] = f"{flag}={value}"
    return extra


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="app.py", description="Watch a Diffusion-Gemma sampler denoise many canvases at once.",
                       epilog="Environment (when the flag is absent): " + ", ".join(f"{k} for {v}" for k, v in ENV_FLAGS.items())
                       + "; HF_TOKEN for gated hub checkpoints.")
    p.add_argument("--model", default=None,
                   help="checkpoint directory or hub id (default: $DGEMMA_MODEL, else the embedded model in assets/model)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the model runs (default: auto)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="weights' dtype (default auto: bfloat16 on CUDA, float32 on CPU)")
    # A Space sets GRADIO_SERVER_NAME=0.0.0.0 for its proxy; everywhere else this machine only.
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="address to bind (default 127.0.0.1, this machine only; $GRADIO_SERVER_NAME on a Space)")
    p.add_argument("--port", type=_port, default=None, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--max-num-seqs", type=positive_int, default=32, help="requests denoising at once (default 32)")
    p.add_argument("--memory-budget", type=_size, default=None,
                   help="device memory the app may use, e.g. 2GiB (CUDA: a per-process cap; CPU: a virtual device)")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    p.add_argument("--max-prompts", type=positive_int, default=64, help="prompts per call, UI or API (default 64)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="largest max_new_tokens a call may ask (default 256)")
    p.add_argument("--max-queued", type=positive_int, default=64,
                   help="requests one session may have waiting or running at once (default 64)")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = _env_args(argv)
    if extra:
        # The variables go through argparse exactly like typed flags; a bad one is named in the error.
        p.parse_args(argv)  # the typed flags' own errors first
        fail = p.error
        p.error = lambda message: fail(f"{message} (from ${' $'.join(extra)})")  # type: ignore[method-assign]
    return p.parse_args([*extra.values(), *argv])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Our own INFO lines (a closed session's requests cancelled, engine restarts) on stderr.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.getLogger("dgemma").addHandler(handler)
    logging.getLogger("dgemma").setLevel(logging.INFO)
    started = time.monotonic()
    from dgemma.model.loading import ModelLoadError, resolve_source

    try:  # a missing checkpoint is one line now, not after the UI libraries have loaded
        resolve_source(args.model)
    except ModelLoadError as err:
        print(f"app.py: error: {err}", file=sys.stderr)
        return 2
    from dgemma.ui.engine_backend import BackendError, make_backend

    try:
        backend = make_backend(args)
    except BackendError as err:
        print(f"app.py: error: {err}", file=sys.stderr)
        return 2

    from dgemma.ui.layout import build_demo

    demo = build_demo(backend)
    demo.queue(default_concurrency_limit=None)
    port = args.port or int(os.environ.get("GRADIO_SERVER_PORT", 7860))
    demo.launch(
        server_name=args.host,
        server_port=port,
        share=args.share,
        css_paths=[str(ROOT / "assets" / "style.css")],
        show_error=True,  # gr.Error sentences reach the page and the client
        max_threads=256,  # each live stream or API call waits in a thread; a classroom is many
        prevent_thread_lock=True,
        quiet=True,
    )
    # One line the tests and people can wait for: the server answers from here on.
    print(f"dgemma app ready at http://{args.host}:{port} in {time.monotonic() - started:.1f} s", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
