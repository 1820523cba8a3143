"""What a tab keeps of its run, and where: its file on disk and its recording in memory, both capped.

The run file goes to the app's directory for visitors' files (dgemma/serving/runfiles.py): one per tab,
removed when the tab closes, after the files' age, or, oldest first, when all files pass the disk
cap. The recording and the board last shown count against the cap on what all tabs keep in memory
(dgemma/serving/held_runs.py); evicted, a tab's next view says so in one sentence. An uploaded run file is
read (never more than the largest a run file can be) and removed at once: no upload stays on disk.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass

import gradio as gr

from dgemma.serving import held_runs, runfiles
from dgemma.serving.held_runs import HeldRuns, Holder
from dgemma.recording import Recording, RecordingError, load_file
from dgemma.serving.runfiles import RunFiles

log = logging.getLogger(__name__)

# A tab keeps its last run, and one run for each side of its last comparison: each under a key of its own.
COMPARE_SLOTS = ("compare-a", "compare-b")


def slot_key(session: str, slot: str = "") -> str:
    """The key a tab's run is kept under: the session's own, or one of its other slots."""
    return f"{session}#{slot}" if slot else session


@dataclass(frozen=True)
class Keeping:
    """The app's two caps: run files on disk, runs held in memory."""

    files: RunFiles
    held: HeldRuns

    @classmethod
    def default(cls) -> Keeping:
        """For a page built outside app.py (as tests build one): a directory of its own, the default caps."""
        files = RunFiles(tempfile.mkdtemp(prefix="dgemma-page-files-"), runfiles.DEFAULT_MAX_BYTES,
                         runfiles.DEFAULT_MAX_AGE_S)
        return cls(files.start(), HeldRuns(held_runs.DEFAULT_MAX_BYTES))

    def closed(self, session: str) -> None:
        """A tab closed: its run files go, and what its runs held in memory."""
        for key in (session, *(slot_key(session, slot) for slot in COMPARE_SLOTS)):
            self.files.release(key)
            self.held.release(key)


def finished(holder: Holder, recording: Recording, keeping: Keeping, session: str) -> gr.DownloadButton:
    """A run ended: its file is written for Download run, and what it holds counted under the cap
    (still live: it becomes evictable when its stream has sent its last frame)."""
    keeping.held.hold(session, holder)
    try:
        return gr.DownloadButton(value=keeping.files.save(session, recording.save), interactive=True)
    except OSError as err:  # a full or read-only disk, or past the cap: the run still shows, only the file is missing
        log.warning("could not write the run's file: %s", err)
        return gr.DownloadButton(value=None, interactive=False)


def read_upload(file, keeping: Keeping) -> Recording:
    """The run in an uploaded file (at most MAX_FILE_BYTES read), the file removed whatever it held;
    gr.Error with one sentence for anything that is not a run."""
    path = file if isinstance(file, str) else getattr(file, "name", None)
    if not path:
        raise gr.Error("No file arrived; choose a run file (.jsonl) again.", print_exception=False)
    try:
        return load_file(path)
    except RecordingError as err:
        raise gr.Error(str(err), print_exception=False) from None
    except OSError as err:
        raise gr.Error(f"The file could not be read: {err.strerror or err}.", print_exception=False) from None
    finally:
        keeping.files.remove(path)
