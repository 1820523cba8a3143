"""A hub checkpoint's download, followed by the loading line (dgemma/model/download.py).

No network: the bars are made the way huggingface_hub's `snapshot_download` makes them (its own
`_create_progress_bar`, with our `tqdm_class`) and advanced the way its per-file downloads do;
a hub id is loaded for real from a Hugging Face cache laid out on disk, offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from huggingface_hub.utils.tqdm import _create_progress_bar

from dgemma.model.download import BYTES_BAR, DownloadProgress
from app_server import ROOT


def hub_bars(progress: DownloadProgress):
    """The two byte bars and the file bar snapshot_download opens, in its order and with its kwargs."""
    transfer = _create_progress_bar(cls=progress.tqdm_class, log_level=20, name=f"{BYTES_BAR}.transfer",
                                    desc="Downloading bytes", total=0, initial=0, unit="B", unit_scale=True)
    written = _create_progress_bar(cls=progress.tqdm_class, log_level=20, name=BYTES_BAR,
                                   desc="Reconstructing (incomplete total...)", total=0, initial=0, unit="B",
                                   unit_scale=True)  # fmt: skip
    files = progress.tqdm_class(total=2, desc="Fetching 2 files")
    return transfer, written, files


def add_file(transfer, written, size: int) -> None:
    """What one file's download does to the aggregated bars: it adds its size to both totals."""
    for bar in (transfer, written):
        bar.total = (bar.total or 0) + size


def test_the_line_gives_bytes_written_of_the_files_total():
    progress = DownloadProgress()
    assert progress.describe() is None  # nothing downloading yet
    transfer, written, files = hub_bars(progress)
    add_file(transfer, written, 26_000_000_000)
    add_file(transfer, written, 26_000_000_000)
    transfer.update(20_000_000_000)  # network bytes (compressed, deduplicated) are not the file bytes
    written.update(12_300_000_000)
    files.update(1)
    assert progress.describe() == "downloading weights 12.3 / 52.0 GB"
    written.update(39_700_000_000)
    assert progress.describe() == "downloading weights 52.0 / 52.0 GB"


def test_without_a_byte_bar_the_line_counts_files():
    progress = DownloadProgress()
    files = progress.tqdm_class(total=12, desc="Fetching 12 files")
    files.update(3)
    assert progress.describe() == "downloading weights 3 / 12 files"


def test_updates_from_many_threads_all_count():
    progress = DownloadProgress()
    _, written, _ = hub_bars(progress)
    written.total = 8 * 1000 * 1_000_000

    def fetch():
        for _ in range(1000):
            written.update(1_000_000)

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert progress.counts() == (8e9, 8e9, "B")


def test_the_bars_print_nothing(capsys):
    progress = DownloadProgress()
    transfer, written, files = hub_bars(progress)
    add_file(transfer, written, 1000)
    written.update(500)
    for bar in (transfer, written, files):
        bar.close()
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_the_loading_status_line_shows_the_download():
    from dgemma.serving.loading import LoadingBackend
    from dgemma.settings import Limits

    backend = LoadingBackend(Limits(), 8, None, "google/diffusiongemma-26B-A4B-it")
    halfway, finish = threading.Event(), threading.Event()

    def build(stage):
        stage("reading the weights and starting the engine")
        transfer, written, _ = hub_bars(backend.download)
        add_file(transfer, written, 52_000_000_000)
        written.update(12_300_000_000)
        halfway.set()
        finish.wait(30)
        raise ValueError("stopped by the test")

    loader = threading.Thread(target=backend.load, args=(build,))
    loader.start()
    try:
        assert halfway.wait(30)
        message = backend.state().message
        assert message.startswith("Loading model … (") and message.endswith("downloading weights 12.3 / 52.0 GB.")
    finally:
        finish.set()
        loader.join(30)


@pytest.mark.server
def test_a_hub_id_loads_from_the_hugging_face_cache_offline(tiny_model_dir, tmp_path):
    cache = tmp_path / "hub"
    repo = cache / "models--dgemma-test--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    code = ("from dgemma.model.loading import load_model; m = load_model('dgemma-test/tiny', device='cpu'); "
            "print(m.name, m.vocab_size, m.canvas_length, m.model.config._name_or_path)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    name, vocab, canvas, files = done.stdout.split()
    assert (name, vocab, canvas) == ("dgemma-test/tiny", "64", "16")
    assert Path(files) == repo / "snapshots" / commit  # the weights were read from the cache's snapshot
