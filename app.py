"""dgemma demo: `python app.py` serves the app on the embedded model at http://127.0.0.1:7860.

Thin on purpose: flags -> backend (model + engine) -> Blocks -> launch with the queue.
The model path comes only from here (the command line), never from the UI or the API.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# Gradio's usage analytics would phone home from a teaching laptop or a Space: off by default.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Gradio's queue keeps a record of its last events for its monitoring page, about half a kilobyte
# each, 10,000 by default: under steady API traffic that reads as growth for hours. 1,000 is plenty.
os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1000")

from dgemma.memory.allocator import cap_malloc_arenas  # noqa: E402

cap_malloc_arenas()  # before any thread allocates: a server's threads otherwise spread over many arenas

from dgemma.serving.zerogpu import enabled as zerogpu_enabled  # noqa: E402

if zerogpu_enabled():  # `import spaces` before anything touches CUDA (torch included)
    import spaces  # noqa: F401

from dgemma.cli import ArgumentParser, positive_int, size_arg  # noqa: E402  (after the environment is set)
from dgemma.errors import first_line  # noqa: E402
from dgemma.app_process import PAGE_LINE, READY_LINE  # noqa: E402

FAILED_LINGER_S = float(os.environ.get("DGEMMA_FAILED_LINGER_S", "10"))  # the failure stays on the page
ZEROGPU_QUEUE_SIZE = 64  # clicks waiting for ZeroGPU's scheduler
GZIP_LEVEL = 6  # zlib's own balance of CPU and size: every frame of every stream goes through it
# How often Gradio's queue looks for work, and for gr.Progress updates (which this app sends none of),
# while it has none. Gradio 6.31 looks every 1 ms and 10 ms except on Windows (queueing.py), which
# kept 7-9 % of a core busy in an app nobody used; Gradio's own Windows values, 50 ms and 100 ms,
# leave 0.9-1.4 % (scripts/measure_idle_cpu.sh) and add at most 50 ms to a call's start. No public
# setting: see _poll_less.
QUEUE_POLL_S = {"sleep_when_free": 0.05, "progress_update_sleep_when_free": 0.1}
# Gradio keeps about 190 KiB for every session it has seen, and an API client's session never
# closes; past this many the least recently used goes (Gradio's default, 10,000, is about 1.9 GiB).
SESSION_CAPACITY = int(os.environ.get("DGEMMA_SESSION_CAPACITY", "2000"))


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


# On a Space nobody passes flags: these variables stand in for them (a flag given still wins).
# HF_TOKEN is read by huggingface_hub itself, for gated checkpoints.
ENV_FLAGS = {
    "DGEMMA_MODEL": "--model", "DGEMMA_DEVICE": "--device", "DGEMMA_DTYPE": "--dtype",
    "DGEMMA_LOAD_FORMAT": "--load-format", "DGEMMA_EXPERTS": "--experts", "DGEMMA_MAX_NUM_SEQS": "--max-num-seqs", "DGEMMA_MEMORY_BUDGET": "--memory-budget",
    "DGEMMA_MAX_DISK": "--max-disk", "DGEMMA_FILES_MAX_AGE": "--files-max-age", "DGEMMA_MAX_RUN_MEMORY": "--max-run-memory",
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
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="auto: the checkpoint's weights; dummy: random weights of its config, built on the device (vLLM's name)")
    p.add_argument("--experts", default="auto", choices=["auto", "per_canvas", "whole_batch"],
                   help="many experts run per canvas (batch-invariant) or over the whole batch (one read of the weights a step); "
                        "default auto: per_canvas on CPU, whole_batch on CUDA")
    # A Space sets GRADIO_SERVER_NAME=0.0.0.0 for its proxy; everywhere else this machine only.
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="address to bind (default 127.0.0.1, this machine only; $GRADIO_SERVER_NAME on a Space)")
    p.add_argument("--port", type=_port, default=None, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--max-num-seqs", type=positive_int, default=32, help="requests denoising at once (default 32)")
    p.add_argument("--memory-budget", type=size_arg, default=None,
                   help="device memory the app may use, e.g. 2GiB (CUDA: a per-process cap; CPU: a virtual device)")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    p.add_argument("--max-prompts", type=positive_int, default=64, help="prompts per call, UI or API (default 64)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="largest max_new_tokens a call may ask (default 256)")
    p.add_argument("--max-queued", type=positive_int, default=64,
                   help="requests one tab (a browser tab or an API client) may have waiting or running at once (default 64)")
    p.add_argument("--max-disk", type=size_arg, default="2GiB",
                   help="disk all visitors' run files and uploads may use together, oldest removed first (default 2GiB)")
    p.add_argument("--files-max-age", type=positive_int, default=3600,
                   help="seconds a run file or upload is kept at most; a tab's go when it closes (default 3600)")
    p.add_argument("--max-run-memory", type=size_arg, default="1GiB",
                   help="memory all tabs' kept runs may hold together, least recently viewed evicted first (default 1GiB)")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = _env_args(argv)
    if extra:
        # The variables go through argparse exactly like typed flags; a bad one is named in the error.
        p.parse_args(argv)  # the typed flags' own errors first
        fail = p.error
        p.error = lambda message: fail(f"{message} (from ${' $'.join(extra)})")  # type: ignore[method-assign]
    return p.parse_args([*extra.values(), *argv])


def _log_to_stderr() -> None:
    # Our own INFO lines (a closed tab's requests cancelled, engine restarts) on stderr.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.getLogger("dgemma").addHandler(handler)
    logging.getLogger("dgemma").setLevel(logging.INFO)


def _fail(message: str) -> int:
    print(f"app.py: error: {message}", file=sys.stderr, flush=True)
    return 2


def _keeping(args: argparse.Namespace):
    """Where the page keeps visitors' run files (args.files) and the cap on runs held in memory."""
    from dgemma.serving.held_runs import HeldRuns
    from dgemma.serving.runs import Keeping

    return Keeping(args.files, HeldRuns(args.max_run_memory))


def _open_files(args: argparse.Namespace) -> None:
    """The app's directory for visitors' files (dgemma/serving/runfiles.py), before Gradio is imported: its
    upload folder is that directory. Kept on `args` for the launch (`args.files`)."""
    from dgemma.serving.runfiles import RunFiles

    parent = os.environ.get("GRADIO_TEMP_DIR")  # one set by the user is where the directory goes
    args.files = RunFiles.for_this_start(args.max_disk, args.files_max_age, parent)
    os.environ["GRADIO_TEMP_DIR"] = str(args.files.root)


def _upload_limits(demo, args: argparse.Namespace) -> dict:
    """launch()'s arguments that size uploads: Gradio's own cap (the page checks it before sending),
    and the guard that sizes every upload before a byte is stored (dgemma/serving/runfiles.py)."""
    from starlette.middleware import Middleware

    from dgemma.recording import MAX_FILE_BYTES
    from dgemma.serving.runfiles import UploadGuard

    files = args.files
    largest = min(MAX_FILE_BYTES, files.max_bytes)
    # Gradio keeps the path of every file it served or stored; forget those removed, or the sets grow for ever.
    files.removed_hooks.append(lambda path: [s.discard(path) for s in getattr(demo, "temp_file_sets", [])])
    return {"max_file_size": largest,
            "app_kwargs": {"middleware": [Middleware(UploadGuard, files=files, max_file_bytes=largest)]}}


def compression():
    """Every frame of the live view goes through the page's event stream, which Gradio leaves
    uncompressed: Starlette's gzip compresses it, flushed per chunk (so per frame) once event streams
    are no longer among the types it leaves alone."""
    from starlette.middleware import Middleware
    from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware

    streams = tuple(t for t in DEFAULT_EXCLUDED_CONTENT_TYPES if t != "text/event-stream")
    return Middleware(GZipMiddleware, compresslevel=GZIP_LEVEL, exclude_content_types=streams)


def _launch(demo, args: argparse.Namespace) -> int:
    from starlette.middleware import Middleware

    from dgemma.serving.acks import AckRoute

    port = args.port or int(os.environ.get("GRADIO_SERVER_PORT", 7860))
    limits = _upload_limits(demo, args)
    # Compression outermost, so the guard's refusals are plain; the page says which frames it drew
    # (serving/acks.py) behind both, as any request.
    middleware = [compression(), *limits.pop("app_kwargs")["middleware"], Middleware(AckRoute)]
    demo.launch(
        **limits,
        server_name=args.host,
        server_port=port,
        share=args.share,
        css_paths=[str(ROOT / "assets" / "style.css")],
        show_error=True,  # gr.Error sentences reach the page and the client
        state_session_capacity=SESSION_CAPACITY,
        max_threads=256,  # each live stream or API call waits in a thread; a classroom is many
        prevent_thread_lock=True,
        quiet=True,
        app_kwargs={"middleware": middleware},
    )
    _poll_less(demo)
    return port


def _poll_less(demo) -> None:
    """Gradio's queue polls as QUEUE_POLL_S says. The one write to Gradio's private state
    (tests/test_no_private_access.py allows it): where a Gradio lacks it, the queue polls as Gradio does."""
    queue = getattr(demo, "_queue", None)
    for name, seconds in QUEUE_POLL_S.items():
        if hasattr(queue, name):
            setattr(queue, name, seconds)


def _serve(demo, close) -> int:
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        close()
    return 0



def main_page_first(args: argparse.Namespace, started: float) -> int:
    """Serve the page at once, then load torch, transformers and the model on a thread."""
    import threading

    from dgemma.serving.loading import LoadingBackend
    from dgemma.settings import Limits
    from dgemma.ui.page import build_demo
    from dgemma.units import format_bytes

    limits = Limits(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, max_queued=args.max_queued)
    budget = format_bytes(args.memory_budget) if args.memory_budget else None
    backend = LoadingBackend(limits, args.max_num_seqs, budget, args.model)
    # The queue's default concurrency (none: the engine batches), read by the queue every Blocks
    # starts with: a demo.queue(...) call would rebuild the whole server app once more (~0.3 s).
    os.environ["GRADIO_DEFAULT_CONCURRENCY_LIMIT"] = "none"
    demo = build_demo(backend, _keeping(args))
    port = _launch(demo, args)
    print(f"{PAGE_LINE} http://{args.host}:{port} in {time.monotonic() - started:.1f} s", flush=True)

    def build(stage):
        stage("importing torch and transformers")
        from dgemma.serving.engine_backend import make_backend

        stage("reading the weights and starting the engine")
        return make_backend(args, progress=backend.download)

    threading.Thread(target=backend.load, args=(build,), name="dgemma-load", daemon=True).start()
    try:
        backend.loaded.wait()
    except KeyboardInterrupt:
        demo.close()
        return 0
    if backend.error:  # on the page (status line, API) for a moment, on stderr, then exit non-zero
        _fail(backend.error)
        try:
            time.sleep(FAILED_LINGER_S)
        except KeyboardInterrupt:  # Ctrl-C ends the moment early; the exit still says the load failed
            pass
        demo.close()
        return 2
    # One line the tests and people can wait for: the model answers from here on.
    print(f"{READY_LINE} http://{args.host}:{port} in {time.monotonic() - started:.1f} s", flush=True)
    return _serve(demo, backend.close)


def main_zerogpu(args: argparse.Namespace, started: float) -> int:
    """ZeroGPU: the model is loaded and put on "cuda" here, in the main thread, before launch
    (spaces' CUDA emulation is thread-local), so the page comes after the model on a Space."""
    from dgemma.serving.zerogpu import make_zerogpu_backend
    from dgemma.ui.page import build_demo

    try:
        backend = make_zerogpu_backend(args)
    except Exception as err:  # noqa: BLE001 - one sentence, never a traceback
        return _fail(first_line(err))
    demo = build_demo(backend, _keeping(args))
    # One batch per click: visitors queue in ZeroGPU's scheduler, so Gradio's queue only holds
    # clicks waiting for it; on ZeroGPU its max_size would otherwise default to 1.
    demo.queue(default_concurrency_limit=None, max_size=ZEROGPU_QUEUE_SIZE)
    port = _launch(demo, args)
    print(f"{PAGE_LINE} http://{args.host}:{port} in {time.monotonic() - started:.1f} s", flush=True)
    print(f"{READY_LINE} http://{args.host}:{port} in {time.monotonic() - started:.1f} s", flush=True)
    return _serve(demo, backend.close)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _log_to_stderr()
    started = time.monotonic()
    from dgemma.model.source import ModelLoadError, resolve_source  # torch-free: the page comes first

    try:  # a missing checkpoint is one line now, before any server starts
        resolve_source(args.model)
    except ModelLoadError as err:
        return _fail(str(err))
    if args.device == "cuda":  # asked for by name: say at once if there is none (this imports torch)
        from dgemma.memory import resolve_device

        try:
            resolve_device(args.device)
        except ValueError as err:
            return _fail(str(err))
    # SIGTERM (a Space stopping, a test ending) exits like Ctrl-C, so spaces' workers end with us.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    _open_files(args)
    try:
        if zerogpu_enabled():
            return main_zerogpu(args, started)
        return main_page_first(args, started)
    finally:
        args.files.close()  # a stopped app leaves no visitor's file behind


if __name__ == "__main__":
    sys.exit(main())
