"""ZeroGPU without ZeroGPU (installed by sitecustomize.py): the real `spaces` package with only its outside world stubbed.

Put on PYTHONPATH (tests/zerogpu_sim, whose sitecustomize.py calls `install()`) (with SPACES_ZERO_GPU=1) for a `python app.py` subprocess by
tests/test_zerogpu.py. What is replaced, and nothing else:
- the scheduler client `spaces.zero.client.schedule / allow / release / startup_report` (HTTP
  calls to Hugging Face's device API): schedule grants a GPU at once, or raises the package's own
  quota error while the file $DGEMMA_SIM_DIR/quota exists;
- the CUDA steps of a worker's start, `spaces.zero.torch.init / move`: on a CPU the "move" gives
  every tensor the app put on "cuda" its data back on the CPU, from where spaces kept it (in
  memory or in its offload pack on disk);
- on a CPU-only torch, what spaces reads from a CUDA build: `torch.version.cuda`,
  `torch._C._cuda_init` (saved at import, called nowhere here), and a picklable
  `torch.cuda._is_in_bad_fork` (spaces runs it in a forked pool at import).
Every call is appended to $DGEMMA_SIM_DIR/calls.log as "name pid detail" for the tests to read,
and SIGUSR1 writes the main process's thread names to $DGEMMA_SIM_DIR/threads-<pid>.txt.
"""

import os

SIM_DIR = os.environ.get("DGEMMA_SIM_DIR", "")


def _never_in_bad_fork() -> bool:
    return False


def _record(name: str, detail: str = "") -> None:
    with open(os.path.join(SIM_DIR, "calls.log"), "a") as f:
        f.write(f"{name} {os.getpid()} {detail}\n")


def _install() -> None:
    import signal
    import threading

    import torch

    if torch.version.cuda is None:  # a CPU-only build
        torch.version.cuda = "12.8"
        torch._C._cuda_init = lambda: None
        torch.cuda._is_in_bad_fork = _never_in_bad_fork

    import spaces  # noqa: F401  (patches torch, as on a Space)
    from spaces.zero import api, client
    from spaces.zero import torch as zero_torch
    from spaces.zero.gradio import error
    from spaces.zero.torch import patching

    tokens = iter(range(1, 1_000_000))

    def schedule(task_id, request=None, duration=None, gpu_size=None, _first_attempt=True):
        if os.path.exists(os.path.join(SIM_DIR, "quota")):
            _record("schedule-refused", str(task_id))
            raise error("ZeroGPU quota exceeded",
                        "You have exceeded your free ZeroGPU quota (60s requested vs. 12s left). Try again in 0:04:10.")
        _record("schedule", f"{task_id} {duration.total_seconds() if duration is not None else None} {gpu_size}")
        return api.ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="GPU-sim", allowToken=f"token-{next(tokens)}")

    def allow(allow_token):
        _record("allow", allow_token)  # called in the worker: its pid is the worker's

    def release(allow_token, *, fail=False, allow_404=False):
        _record("release", f"{allow_token} fail={fail}")

    def startup_report():
        _record("startup_report")

    def init(nvidia_uuid):
        _record("init", nvidia_uuid)

    def move(callback=None):
        for fake, original in patching.cuda_aliases.items():
            if original is not None:
                fake.data = original
        for pack in patching.tensor_packs:
            _unpack_to_cpu(pack)
        _record("move")

    client.schedule, client.allow, client.release, client.startup_report = schedule, allow, release, startup_report
    zero_torch.init, zero_torch.move = init, move

    def dump_threads(*_):
        names = [t.name for t in threading.enumerate()]
        path = os.path.join(SIM_DIR, f"threads-{os.getpid()}.txt")
        with open(path + ".part", "w") as f:  # renamed when whole: the reader never sees it half-written
            f.write("\n".join(names) + "\n")
        os.replace(path + ".part", path)

    signal.signal(signal.SIGUSR1, dump_threads)


def _unpack_to_cpu(pack) -> None:
    """spaces' pack file, read back the way `pack_to_cuda` reads it, into CPU tensors."""
    import torch

    with open(pack.path(), "rb") as f:
        entries = [entry for batch in pack.batches for entry in batch] + list(pack.big_tensors)
        for meta, size, aligned_size in entries:
            raw = bytearray(f.read(aligned_size))[:size]
            storage = torch.frombuffer(raw, dtype=torch.uint8).untyped_storage()
            tensor = torch.tensor([], dtype=meta.dtype).set_(storage, 0, meta.shape, meta.stride())
            for fake in pack.fakes[meta]:
                fake.data = tensor


def install() -> None:
    if SIM_DIR and os.environ.get("SPACES_ZERO_GPU"):
        _install()
