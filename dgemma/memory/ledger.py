"""The ledger: what a run holds in memory, term by term, and the one place those terms are added up.

vLLM's start-up log breaks a GPU down into weights, activation peak and KV cache; PyTorch's memory
visualizer stacks categories over time. Ours, bottom to top: a runtime reserve (a GPU's context and
workspaces; none on a CPU), the weights, the engine's standing state (its default sampler's per-slot
state, built at start and kept), this run's own sampler state (a run whose options differ builds one:
the lesson's, a run with a budget), the requests' KV caches, and one sampler call's tile transient.
Whatever the budget leaves above them is free.

Plain numbers in, plain numbers out: the model's facts (`ModelFacts`), the run's shape (`RunShape`:
its prompts' lengths, canvases, vocabulary) and a `Calibration` (the sampler measures one on meta
tensors; it is passed in, never computed here). The pre-run check (`Ledger.fits`, `refusal`), the
suggested budget, the planner (`plan_tiles`), `python -m dgemma.plan` and the charts all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dgemma.units import format_bytes

HISTORY_DEPTH = 8  # the sampler's per-slot history of drafts (sampling/params.py MAX_STABILITY; a test holds them equal)
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
TERMS = (  # (field, what the budget holds, as a sentence and a chart name it)
    ("reserve", "the runtime's reserve"),
    ("weights", "the model weights"),
    ("engine_state", "the engine's sampler state"),
    ("run_state", "this run's sampler state"),
    ("kv_caches", "the KV caches"),
)


@dataclass(frozen=True)
class Calibration:
    """Transient bytes of one sampler call: `fixed + per_request * n` for a tile of n requests."""

    bytes_per_request: int
    fixed_bytes: int
    canvas_length: int
    vocab_size: int

    @property
    def copies_per_request(self) -> float:
        """How many fp32 [CL, vocab] tensors one request keeps alive at the peak."""
        return self.bytes_per_request / (self.canvas_length * self.vocab_size * 4)

    def tile_bytes(self, n: int) -> int:
        return self.fixed_bytes + self.bytes_per_request * n


@dataclass(frozen=True)
class ModelFacts:
    """What the ledger reads of a model, as plain values (ZeroGPU's main process holds no weights)."""

    weight_bytes: int
    canvas_length: int
    vocab_size: int
    hidden_size: int
    embed_dtype: str  # the embedding's (and so the soft embedding's) dtype, e.g. "bfloat16"
    kv_bytes_per_token: int  # keys and values of one token over every decoder layer
    max_num_seqs: int  # the engine's slots: every sampler holds state for this many
    device: str = "cpu"  # where the sampler step runs (a CPU's step takes positions in groups)
    softcap: float | None = None


@dataclass(frozen=True)
class RunShape:
    """A run as the ledger counts it: each request's prompt length, the canvases each denoises, the
    sampler's vocabulary (above the model's: padded, the lesson's real scale), and whether it runs on
    a sampler of its own (its options differ from the engine's default) or the engine's."""

    prompt_tokens: tuple[int, ...]
    canvases: int = 1
    vocab_size: int | None = None  # None: the model's
    own_sampler: bool = True


def sampler_state_bytes(facts: ModelFacts, vocab_size: int | None = None) -> int:
    """One sampler's per-slot state for `max_num_seqs` slots (sampling/tiled.py's buffers: canvas, draft,
    pins and history as int64, the soft embedding in the embedding's dtype, logprobs and entropies in
    fp32, phases and masks in bytes) plus, at a padded vocabulary, its own padded embedding."""
    cl, itemsize = facts.canvas_length, ITEMSIZE[facts.embed_dtype]
    per_slot = cl * (3 * 8 + HISTORY_DEPTH * 8 + facts.hidden_size * itemsize + 2 * 4 + 2) + HISTORY_DEPTH + 1 + 4 + 1
    padded = vocab_size if vocab_size is not None and vocab_size > facts.vocab_size else 0
    return facts.max_num_seqs * per_slot + padded * facts.hidden_size * itemsize


@dataclass(frozen=True)
class Ledger:
    """What a run holds, by term (`TERMS`), one tile's transient on top, against a budget (None: none)."""

    budget: int | None
    reserve: int
    weights: int
    engine_state: int
    run_state: int
    kv_caches: int
    tile: int  # one sampler call's transient at `tile_requests`
    tile_requests: int
    requests: int

    @property
    def held(self) -> int:
        """Everything resident before the sampler call: the sum of `TERMS`."""
        return self.reserve + self.weights + self.engine_state + self.run_state + self.kv_caches

    @property
    def needed(self) -> int:
        return self.held + self.tile

    @property
    def free(self) -> int | None:
        """What the budget leaves for the sampler call (None: no budget)."""
        return None if self.budget is None else max(0, self.budget - self.held)

    @property
    def holds_weights(self) -> bool:
        """Whether the budget holds the reserve and the weights at all (else nothing runs)."""
        return self.budget is None or self.reserve + self.weights <= self.budget

    @property
    def left(self) -> int:
        """What the budget leaves above the call's tile (0: none, or no budget)."""
        return max(0, (self.budget or 0) - self.needed)

    @property
    def fits(self) -> bool:
        return self.budget is None or self.needed <= self.budget

    @classmethod
    def of_call(cls, budget: int | None, held: dict[str, int], tile: int, tile_requests: int, requests: int) -> Ledger:
        """A sampler call's ledger as the engine counted it: `held` by term (a TilePlan's, or an
        out-of-memory's), the tile's peak (or what it tried to allocate) on top."""
        terms = {key: int(held.get(key, 0)) for key, _ in TERMS}
        return cls(budget=budget, tile=tile, tile_requests=tile_requests, requests=requests, **terms)

    def terms(self) -> list[tuple[str, int]]:
        """(what, bytes) bottom to top, the tile last; terms of 0 bytes left out."""
        held = [(name, getattr(self, key)) for key, name in TERMS]
        tile = "one request's sampler step" if self.tile_requests == 1 else f"a tile of {self.tile_requests} requests"
        return [(name, n) for name, n in held + [(tile, self.tile)] if n]


def run_ledger(facts: ModelFacts, shape: RunShape, calibration: Calibration, budget: int | None = None,
               tile_requests: int = 1, reserve: int = 0) -> Ledger:  # fmt: skip
    """The ledger of a run of `shape` with one tile of `tile_requests` (at most the slots' worth): the
    engine's default sampler is held whatever runs; a run of other options holds its own beside it;
    the requests' KV caches hold each prompt and every canvas but the last (committed ones are
    appended), for the `max_num_seqs` longest at once."""
    vocab = shape.vocab_size or facts.vocab_size
    running = sorted(shape.prompt_tokens, reverse=True)[: facts.max_num_seqs]
    tokens = sum(running) + len(running) * (shape.canvases - 1) * facts.canvas_length
    tile_requests = max(1, min(tile_requests, len(running) or 1))
    return Ledger(
        budget=budget, reserve=reserve, weights=facts.weight_bytes, engine_state=sampler_state_bytes(facts),
        run_state=sampler_state_bytes(facts, vocab) if shape.own_sampler else 0,
        kv_caches=tokens * facts.kv_bytes_per_token, tile=calibration.tile_bytes(tile_requests),
        tile_requests=tile_requests, requests=len(shape.prompt_tokens),
    )  # fmt: skip


def suggested_budget(facts: ModelFacts, shape: RunShape, calibration: Calibration) -> int:
    """The lesson's budget (docs/tiling.md, section 5): what the run holds plus 3/4 of its untiled tile,
    so one tile of every request runs out of memory and tiles of about 3/8 of them fit (and never less
    than two one-request tiles and a request: tiling still has room to work)."""
    untiled = run_ledger(facts, shape, calibration, tile_requests=len(shape.prompt_tokens))
    room = max(int(0.75 * untiled.tile), 2 * calibration.tile_bytes(1) + calibration.bytes_per_request)
    return untiled.held + room


def budget_text(nbytes: int) -> str:
    """A budget as people type it: whole MiB when that is close enough (64 MiB and up), else KiB."""
    mib = -(-nbytes // 2**20)
    return f"{mib}MiB" if mib >= 64 else f"{-(-nbytes // 1024)}KiB"


def refusal(ledger: Ledger, suggestion: int) -> str:
    """'' when the budget holds the run with one request a tile; else one sentence: what it cannot hold,
    with sizes, and the budget to type instead."""
    if ledger.fits:
        return ""
    terms = [f"{name} ({format_bytes(n)})" for name, n in ledger.terms()]
    listed = ", ".join(terms[:-1]) + f" and {terms[-1]}" if len(terms) > 1 else terms[0]
    short = "cannot hold this run" if ledger.holds_weights else "cannot even hold the model weights"
    return (f"The memory budget of {format_bytes(ledger.budget)} {short}: it needs {format_bytes(ledger.needed)} for "
            f"{listed}; the suggested budget for {ledger.requests} request{'s' if ledger.requests != 1 else ''} "
            f"is {budget_text(suggestion)}.")


def plan_tiles(num_decode: int, free_bytes: int, calibration: Calibration, fraction: float = 0.5) -> int:
    """Largest group of requests whose step fits `fraction` of free memory; never below 1.

    Raises `torch.OutOfMemoryError` naming bytes needed and free when even one request cannot
    fit in all of free memory: tiling cannot help then, and the caller should say so.
    """
    if num_decode <= 0:
        return 0
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    one = calibration.tile_bytes(1)
    if one > free_bytes:
        raise_out_of_memory(one, free_bytes, "one request's sampler step")
    usable = int(free_bytes * fraction) - calibration.fixed_bytes
    group = usable // calibration.bytes_per_request
    return int(max(1, min(num_decode, group)))


def raise_out_of_memory(needed: int, free: int, what: str) -> None:
    """A real `torch.OutOfMemoryError` (a CPU's budget, a step that cannot fit) in the allocator's terms."""
    import torch  # only when it raises: the ledger is plain arithmetic, the views read it

    raise torch.OutOfMemoryError(f"out of memory: {what} needs {format_bytes(needed)} but only {format_bytes(free)} is free")


def split_tiles(num_decode: int, group: int, even: bool = False) -> list[tuple[int, int]]:
    """[(start, end), ...] covering 0..num_decode in tiles of `group` (the last may be smaller), or
    with `even` in as many tiles, of sizes that differ by at most one (16 in groups of 7: 6, 5, 5
    rather than 7, 7, 2). Even tiles peak lower, and on a CPU they run faster: each tile's LM
    head and soft embedding are matrix products that read the whole embedding once whatever the
    tile's rows, and a tile of few rows pays that for little work (docs/benchmarks.md)."""
    if not even or num_decode <= group:
        return [(s, min(s + group, num_decode)) for s in range(0, num_decode, group)]
    count = -(-num_decode // group)
    size, larger = divmod(num_decode, count)
    ends = [(i + 1) * size + min(i + 1, larger) for i in range(count)]
    return list(zip([0] + ends[:-1], ends))
