"""A run, kept: every event its board folds, bounded in memory, saved as JSON lines, loaded strictly.

The page, the API (`record: true`) and the CLI (`--record FILE`) record a run the same way, and
playback is the fold of the events up to a step (dgemma/ui/generate_tab/playback.py): one way to
fold, live and replayed. Step k is the state after the run's k-th sampler call: the events before
the (k+1)-th `TilePlan` (step 0: before the first call). Step frames are kept compactly up to
MAX_POSITIONS canvas positions, the released model's canvas (256) x 32 requests x the step limit
(512); frames past it are counted in `dropped_frames`, request events and tile plans always kept.
The bound's sizes, the file's lines and what `load` refuses: docs/architecture.md, "dgemma/recording.py".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import time
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from dgemma.events import Event, RequestEvent, Status, StepEvent, TilePlan, TileSplit
from dgemma.settings import Settings
from dgemma.sizes import object_bytes

FORMAT = "dgemma-run"
VERSION = 1
MAX_POSITIONS = 256 * 32 * 512  # canvas positions over all kept step frames (see the module's docstring)
# A file at the bound is 127 MB (about 30 bytes a position); twice that is no run file. The app
# refuses a larger upload before storing it (Gradio's max_file_size) and reads no more than this.
MAX_FILE_BYTES = 256 * 2**20
PACKAGES = ("torch", "transformers", "gradio")
# The model's facts a header keeps (those `/info` returns).
MODEL_KEYS = ("model", "embedded", "weights", "experts", "parameters", "dtype", "device", "vocab_size", "canvas_length",
              "max_num_seqs")


class RecordingError(ValueError):
    """A run file that cannot be replayed: one sentence saying why."""


@dataclass(frozen=True)
class _Frame:
    """A StepEvent without its pieces (they live once per token id in the recording's table)."""

    request_id: int
    canvas_index: int
    step: int
    max_steps: int
    token_ids: array  # int32: any vocabulary fits
    entropy: array  # float64: the exact floats the engine sent
    accepted: bytes
    mean_entropy: float
    confidence_threshold: float
    converged: bool


def package_versions() -> dict[str, str]:
    """The versions a run was recorded with (read from the installed metadata, nothing imported)."""
    versions = {"python": platform.python_version()}
    for name in ("dgemma", *PACKAGES):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name == "dgemma":
                from dgemma import __version__

                versions[name] = __version__
    return versions


def run_header(model: dict[str, Any], settings: Settings | None, prompts: list[str]) -> dict:
    """The header line's content: what was run (prompts, settings, each prompt's seed), on which
    model (the facts `/info` gives), with which versions."""
    seeds = [settings.params.for_prompt(i).seed for i in range(len(prompts))] if settings is not None else []
    return {
        "format": FORMAT, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {k: v for k, v in model.items() if k in MODEL_KEYS},
        # As JSON has them (tuples as lists), so a loaded header equals the one written.
        "settings": json.loads(json.dumps(asdict(settings))) if settings is not None else {}, "prompts": list(prompts), "seeds": seeds,
        "versions": package_versions(), "max_positions": MAX_POSITIONS,
    }  # fmt: skip


class Recording:
    """Every event of one run, in order, with the index where each step ends."""

    def __init__(self, header: dict[str, Any] | None = None):
        self.header = header if header is not None else run_header({}, None, [])
        self.positions = 0  # canvas positions kept
        self.dropped_frames = 0  # step frames past the bound, not kept
        self._item_bytes = 0  # what the kept events and pieces hold, counted as each is added
        self._items: list[_Frame | RequestEvent | TilePlan] = []
        self._pieces: dict[int, str] = {}
        self._plan_at: list[int] = []  # index in _items of each TilePlan: step k ends before _plan_at[k]
        self.summary: dict | None = None  # the run's quoted figures (dgemma/metrics.py), for the end line

    # ---------------------------------------------------------------- recording

    def add(self, event: Event) -> None:
        if isinstance(event, StepEvent):
            if self.positions + len(event.token_ids) > MAX_POSITIONS:
                self.dropped_frames += 1
                return
            self.positions += len(event.token_ids)
            for token, piece in zip(event.token_ids, event.pieces, strict=True):
                if token not in self._pieces:
                    self._pieces[token] = piece
                    self._item_bytes += sys.getsizeof(token) + sys.getsizeof(piece)  # both kept by the table
            kept = _Frame(
                event.request_id, event.canvas_index, event.step, event.max_steps, array("i", event.token_ids),
                array("d", event.entropy), bytes(event.accepted), event.mean_entropy, event.confidence_threshold,
                event.converged,
            )  # fmt: skip
        else:
            kept = event
            if isinstance(event, TilePlan):
                self._plan_at.append(len(self._items))
                self._item_bytes += object_bytes(len(self._items))
        self._items.append(kept)
        self._item_bytes += object_bytes(kept)

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    @property
    def held_bytes(self) -> int:
        """What this recording holds in memory: its kept events and pieces, and the containers holding them."""
        containers = (self, self._items, self._pieces, self._plan_at)
        return self._item_bytes + sum(sys.getsizeof(c) for c in containers)

    # ---------------------------------------------------------------- reading

    @property
    def steps(self) -> int:
        """The last step: the number of sampler calls recorded (step 0 is before the first)."""
        return len(self._plan_at)

    def end_of_step(self, step: int) -> int:
        """How many events make up the state at `step` (clamped to 0..steps)."""
        plans = self._plan_at
        step = max(0, min(step, len(plans)))
        return plans[step] if step < len(plans) else len(self._items)

    def events(self, upto_step: int | None = None) -> Iterator[Event]:
        """The events in order, every one (None) or those of the state at `upto_step`."""
        return self.events_between(0, len(self._items) if upto_step is None else self.end_of_step(upto_step))

    def events_between(self, start: int, end: int) -> Iterator[Event]:
        """Events `start` to `end` (exclusive; `end_of_step` gives such bounds): a fold that has the
        first `start` continues with these, and knows where it stopped even while events arrive."""
        for item in self._items[start:end]:
            yield self._event(item) if isinstance(item, _Frame) else item

    def _event(self, f: _Frame) -> StepEvent:
        ids = tuple(f.token_ids)
        return StepEvent(
            f.request_id, f.canvas_index, f.step, f.max_steps, ids, tuple(self._pieces[t] for t in ids),
            tuple(f.entropy), tuple(bool(a) for a in f.accepted), f.mean_entropy, f.confidence_threshold, f.converged,
        )  # fmt: skip

    # ---------------------------------------------------------------- the file

    def lines(self) -> Iterator[str]:
        """The file, line by line (each ends with a newline): header, events, end line."""
        digest = hashlib.sha256()
        for count, record in enumerate((self.header, *(_encode(item) for item in self._items))):
            line = json.dumps(record, ensure_ascii=False) + "\n"
            digest.update(line.encode("utf-8"))
            yield line
        end = {"events": count, "steps": self.steps, "dropped_frames": self.dropped_frames,
               "pieces": {str(k): v for k, v in sorted(self._pieces.items())}, "sha256": digest.hexdigest()}
        if self.summary is not None:
            end["summary"] = self.summary
        yield json.dumps({"end": end}, ensure_ascii=False) + "\n"

    def text(self) -> str:
        return "".join(self.lines())

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(self.lines())


PIECE_CHARS = 16  # a piece's string as the bound counts it: most of a large vocabulary's are shorter


def recording_bound(requests: int, max_new_tokens: int, max_steps: int, canvas_length: int, vocab_size: int) -> int:
    """The most a run's recording can hold: every request's every canvas at every step (and its random
    start), at most MAX_POSITIONS positions; a piece for each token id it can meet; each request's
    committed tokens and logprobs and its final text; a tile plan a step. Each item is priced as a
    recording holds it, measured on one (and a quarter more for the containers' spare room)."""
    canvases = math.ceil(max_new_tokens / canvas_length)
    positions = min(MAX_POSITIONS, requests * canvases * canvas_length * (max_steps + 1))
    ids = tuple(range(vocab_size - canvas_length, vocab_size))  # the largest ids: none is a cached small int
    pieces = tuple("x" * (PIECE_CHARS - 1) + chr(65 + i % 26) for i in range(canvas_length))
    sample = Recording()
    empty = sample.held_bytes
    step = StepEvent(1, 0, 1, max_steps, ids, pieces, (0.5,) * canvas_length, (True,) * canvas_length, 0.5, 0.1, False)
    sample.add(step)
    frame_and_pieces = sample.held_bytes - empty
    sample.add(step)  # the same ids again: only the frame
    frame = sample.held_bytes - empty - frame_and_pieces
    piece = (frame_and_pieces - frame) / canvas_length
    before = sample.held_bytes
    sample.add(TilePlan(0.0, "reference", requests, canvas_length, vocab_size, 2**40, None, 2**30, requests,
                        (requests,), 2**30, held=dict(weights=2**40, engine_state=2**40, run_state=2**40, kv_caches=2**40)))
    plan = sample.held_bytes - before
    before = sample.held_bytes
    text = "x" * (canvases * canvas_length * PIECE_CHARS)
    committed = tuple(ids[i % canvas_length] for i in range(canvases * canvas_length))
    sample.add(RequestEvent(1, Status.COMMITTED, token_ids=committed, extra={"logprobs": [-0.5] * len(committed)}))
    sample.add(RequestEvent(1, Status.DONE, text=text))
    request = sample.held_bytes - before
    kept = (positions / canvas_length * frame + min(positions, vocab_size) * piece + requests * request
            + canvases * (max_steps + 1) * plan)
    return int(1.25 * kept) + empty


def _encode(item: _Frame | RequestEvent | TilePlan) -> dict:
    if isinstance(item, _Frame):
        return {"type": "step", "request_id": item.request_id, "canvas_index": item.canvas_index, "step": item.step,
                "max_steps": item.max_steps, "token_ids": item.token_ids.tolist(),
                "entropy": [_finite(x) for x in item.entropy], "accepted": "".join("1" if a else "0" for a in item.accepted),
                "mean_entropy": _finite(item.mean_entropy), "confidence_threshold": item.confidence_threshold,
                "converged": item.converged}  # fmt: skip
    return {"type": "plan" if isinstance(item, TilePlan) else "request", **asdict(item)}


def _finite(x: float) -> float | str:
    # JSON has no inf or nan; a step of non-finite logits reports them (the request then fails).
    return x if math.isfinite(x) else repr(x)


def _float(x: Any) -> float:
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"expected a number, got {x!r:.40}")
    return float(x)


def _decode(record: dict, pieces: dict[int, str]) -> Event:
    kind = record.pop("type", None)
    if kind == "step":
        ids = tuple(int(t) for t in record["token_ids"])
        accepted = record["accepted"]
        if set(accepted) - {"0", "1"} or len(accepted) != len(ids):
            raise ValueError("a step's accepted mask is not one 0 or 1 per position")
        return StepEvent(
            int(record["request_id"]), int(record["canvas_index"]), int(record["step"]), int(record["max_steps"]),
            ids, tuple(pieces[t] for t in ids), tuple(_float(x) for x in record["entropy"]),
            tuple(a == "1" for a in accepted), _float(record["mean_entropy"]), _float(record["confidence_threshold"]),
            bool(record["converged"]),
        )  # fmt: skip
    if kind == "plan":
        splits = tuple(TileSplit(**s) for s in record.pop("splits"))
        return TilePlan(**{**record, "tiles": tuple(record["tiles"]), "splits": splits})
    if kind == "request":
        return RequestEvent(**{**record, "status": Status(record["status"]), "token_ids": tuple(record["token_ids"])})
    raise ValueError(f"unknown event type {kind!r:.40}")


def _too_big(size: int) -> RecordingError:
    return RecordingError(f"This file is {size / 2**20:.0f} MB, more than any run file can be "
                          f"({MAX_FILE_BYTES // 2**20} MB); it is not a dgemma run.")


def load_file(path: str) -> Recording:
    """A recording from the run file at `path`, never reading more than MAX_FILE_BYTES of it: a larger
    file is refused (RecordingError) by its size before any byte is read, or, if it grows meanwhile, after them."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise _too_big(size)
        data = f.read(MAX_FILE_BYTES)
        if f.read(1):
            raise _too_big(MAX_FILE_BYTES + 1)
    return load(data)


def load(data: bytes | str) -> Recording:
    """A recording from a run file's bytes; RecordingError (one sentence) for anything else. The
    bytes are checked and decoded where they lie, one line at a time: a load holds the file and the
    recording it makes, never a second copy of the file (a run file can be 256 MB)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise _too_big(len(data))
    first_end = data.find(b"\n")
    first_end = len(data) if first_end < 0 else first_end
    try:
        data[:first_end].decode("utf-8")
    except UnicodeDecodeError:
        raise RecordingError("This file is not a dgemma run: it is not text (UTF-8).") from None
    header = _json_line(data[:first_end])
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(f"This file is not a dgemma run: its first line is not a {FORMAT} header.")
    if header.get("version") != VERSION:
        raise RecordingError(f"This run file has format version {header.get('version')!r:.20}; this app reads "
                             f"version {VERSION}.")
    end_start = data.rfind(b"\n", 0, len(data) - 1) + 1  # where the last line begins
    end = _json_line(data[end_start:-1]) if data.endswith(b"\n") and end_start > first_end else None
    if not (isinstance(end, dict) and isinstance(end.get("end"), dict)):
        raise RecordingError("This run file is cut short (it does not end with its end line); download it again.")
    end = end["end"]
    events = data.count(b"\n", 0, end_start) - 1
    digest = hashlib.sha256(memoryview(data)[:end_start]).hexdigest()  # every byte before the end line
    if end.get("events") != events or end.get("sha256") != digest:
        raise RecordingError("This run file was changed after it was recorded: its checksum does not match.")
    try:
        pieces = {int(k): str(v) for k, v in end["pieces"].items()}
        recording = Recording(header)
        at = first_end + 1
        while at < end_start:
            line_end = data.index(b"\n", at)
            recording.add(_decode(json.loads(data[at:line_end]), pieces))
            at = line_end + 1
        recording.dropped_frames += int(end.get("dropped_frames", 0))
        summary = end.get("summary")
        recording.summary = dict(summary) if summary is not None else None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        # The checksum matched, so the file is as written: a writer this app does not understand.
        raise RecordingError(f"This run file's events cannot be read by this app ({str(err)[:80]}).") from None
    if recording.steps != end.get("steps"):
        raise RecordingError("This run file was changed after it was recorded: its step count does not match.")
    return recording


def _json_line(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None
