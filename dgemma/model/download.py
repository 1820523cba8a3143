"""A hub checkpoint's download, followed: bytes done / total for the page's loading line.

`download_checkpoint` runs huggingface_hub's `snapshot_download` with a `tqdm_class` of our own
(`DownloadProgress.tqdm_class`): huggingface_hub sizes its bars from the files it is about to
fetch and advances them as bytes are written, so the loading line can say "downloading weights
12.3 / 52.0 GB" while the ~52 GB of the released checkpoint arrive. The bars count only; nothing
is printed. Torch-free: the page reads `describe()` before torch has loaded.
"""

from __future__ import annotations

import threading

from huggingface_hub.utils import tqdm as hub_tqdm

CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt"]
"""What loading reads of a checkpoint: configs, safetensors weights (never pickles), the tokenizer
and its chat template."""
BYTES_BAR = "huggingface_hub.snapshot_download"  # the name huggingface_hub gives its bytes-written bar


class DownloadProgress:
    """The progress bars huggingface_hub opened for one download, read from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bars: list[hub_tqdm] = []
        self.tqdm_class = self._bar_class()

    def _bar_class(self) -> type[hub_tqdm]:
        progress = self

        class CountingBar(hub_tqdm):
            """A huggingface_hub bar that counts (thread-safely) and prints nothing."""

            def __init__(self, *args, **kwargs):
                self.hub_name = kwargs.get("name")
                self.hub_unit = kwargs.get("unit", "it")  # a disabled tqdm keeps neither
                kwargs["disable"] = True  # tqdm then prints nothing; update() below still counts
                super().__init__(*args, **kwargs)
                with progress._lock:
                    progress._bars.append(self)

            def update(self, n: float | None = 1) -> None:
                with progress._lock:
                    self.n += n or 0

            def __iter__(self):  # a disabled tqdm yields without counting: count the files here
                for item in self.iterable:
                    with progress._lock:
                        self.n += 1
                    yield item

        return CountingBar

    def counts(self) -> tuple[float, float, str] | None:
        """(done, total, unit) of the download so far: bytes where huggingface_hub reports them
        (its bytes-written bar, else the largest byte bar), else files; None before any bar."""
        with self._lock:
            bars = [b for b in self._bars if (b.total or 0) > 0]
            in_bytes = [b for b in bars if b.hub_unit == "B"]
            named = [b for b in in_bytes if b.hub_name == BYTES_BAR]
            bar = named[-1] if named else max(in_bytes, key=lambda b: b.total, default=None) or (bars[-1] if bars else None)
            return None if bar is None else (min(bar.n, bar.total), bar.total, "B" if bar.hub_unit == "B" else "files")

    def describe(self) -> str | None:
        """"downloading weights 12.3 / 52.0 GB" (or "… 3 / 12 files"); None before the download."""
        counts = self.counts()
        if counts is None:
            return None
        done, total, unit = counts
        if unit == "B":
            return f"downloading weights {done / 1e9:.1f} / {total / 1e9:.1f} GB"
        return f"downloading weights {done:.0f} / {total:.0f} files"


def download_checkpoint(repo_id: str, progress: DownloadProgress | None = None) -> str:
    """Fetch a hub checkpoint's files into the Hugging Face cache (files already there are not
    fetched again) and return the local snapshot directory."""
    from huggingface_hub import snapshot_download

    tqdm_class = progress.tqdm_class if progress is not None else None
    return snapshot_download(repo_id, allow_patterns=CHECKPOINT_FILES, tqdm_class=tqdm_class)
