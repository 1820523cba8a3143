"""No module reads Gradio's private state or the process's /proc: both move under an upgrade or a host.
One write is allowed: app.py's _poll_less slows the idle queue's polling, and where a Gradio lacks
the attribute it does nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Gradio's queue of a session's unwritten messages, its running jobs, a job's id; this process's files.
PRIVATE = re.compile(r"(?<!self)\._queue\b|[\"']_queue[\"']|\bactive_jobs\b|(?<!self)\._id\b|/proc\b")  # our own `self._queue` is ours
ALLOWED = {("app.py", 'queue = getattr(demo, "_queue", None)')}


def sources() -> list[Path]:
    return [*sorted((ROOT / "dgemma").rglob("*.py")), ROOT / "app.py"]


def test_the_scan_finds_what_it_looks_for():
    assert PRIVATE.search("blocks._queue.pending") and PRIVATE.search("job._id == x") and PRIVATE.search('"/proc/self/fd"')
    assert PRIVATE.search('getattr(blocks, "_queue")')
    assert not PRIVATE.search("self._ids = {}") and not PRIVATE.search("process_id") and not PRIVATE.search("self._queue")


def test_no_module_reads_gradios_private_attributes_or_proc():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sources()
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if PRIVATE.search(line) and (str(path.relative_to(ROOT)), line.strip()) not in ALLOWED]
    assert not found, "\n".join(found)
