"""Memory: sizes, the tracker, the virtual device, calibration and the tile planner."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import contextlib
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dgemma.memory import (
    GiB,
    MiB,
    Calibration,
    HostMemory,
    Repeats,
    TransientTracker,
    VirtualDevice,
    format_bytes,
    measure_peak,
    memory_for,
    parse_size,
    plan_tiles,
    resolve_device,
    split_tiles,
)
from dgemma.sampling import LMHead, RowKey, SamplingParams, Scores, TileInputs, SamplerConfig, TiledSampler, calibrate_tile, reference_tile, seed_tile
from dgemma.sampling.chunked import chunked_tile
from dgemma.sampling.primitives import group_bytes_for


@pytest.mark.parametrize(
    "text, expected",
    [("8GiB", 8 * GiB), ("512MiB", 512 * MiB), ("2GB", 2 * 10**9), ("1.5 gib", int(1.5 * GiB)), ("4096", 4096)],
)
def test_sizes_parse(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 gigs", "", "GiB", "-1GiB", "1e3GiB", "0"])
def test_malformed_sizes_raise_one_clear_line(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("n, text", [(3 * GiB, "3.00 GiB"), (1536 * 1024, "1.5 MiB"), (2048, "2 KiB"), (12, "12 B"),
                                     (None, "—")])
def test_sizes_print_for_people_and_an_unknown_one_as_a_dash(n, text):
    assert format_bytes(n) == text


def test_tracker_counts_new_storages_not_views_of_inputs():
    inputs = torch.zeros(1000)
    with TransientTracker() as tracker:
        view = inputs[10:500]  # a view: no allocation
        doubled = view * 2  # 490 floats
        del view
    assert tracker.peak == doubled.untyped_storage().nbytes() == 490 * 4


def test_tracker_sees_frees():
    with TransientTracker() as tracker:
        a = torch.ones(256)
        del a
        b = torch.ones(128)
    assert tracker.peak == 256 * 4
    assert tracker.live == b.nbytes


def test_tracker_counts_a_view_without_an_alias_annotation_as_no_allocation():
    a, b = torch.ones(3, 4, 5), torch.ones(5, 6)
    with TransientTracker() as tracker:
        product = torch.matmul(a, b)  # mm on a flattened view, then aten._unsafe_view of its output
    assert tracker.peak == tracker.live == product.untyped_storage().nbytes() == 3 * 4 * 6 * 4


def test_nested_trackers_each_count_what_is_made_inside_them():
    with TransientTracker() as outer:
        kept = torch.ones(64)
        with TransientTracker() as inner:
            made = torch.ones(32)
    assert (outer.live, inner.live) == (kept.nbytes + made.nbytes, made.nbytes)


class _PassThrough(TorchDispatchMode):
    """Another dispatch mode: with it active, the trackers see every op (nothing is skipped)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("step", [reference_tile, functools.partial(chunked_tile, chunk_size=4096)], ids=["reference", "chunked"])
@pytest.mark.parametrize("V, CL, n", [(262_144, 16, 3), (40_000, 32, 5)])  # 2 positions a cache group; 13, the last 4
def test_cache_groups_counted_once_each_size_peak_as_when_every_op_is_counted(step, V, CL, n):
    embed, hidden = torch.randn(V, 16), torch.randn(n, CL, 16)
    inputs = TileInputs(
        rows=[RowKey(seed=i, canvas_index=0, step=0, greedy=i == 0) for i in range(n)],
        temperature=torch.ones(n), entropy_bound=torch.full((n,), 0.1), confidence_threshold=torch.full((n,), 0.005),
        last_step=torch.zeros(n, dtype=torch.bool), history=torch.full((n, 8, CL), -1),
        history_valid=torch.zeros(n, 8, dtype=torch.bool), group_bytes=group_bytes_for(embed.device),
    )  # fmt: skip
    scores = Scores(hidden=hidden, head=LMHead(embed, 30.0))
    with TransientTracker() as groups_once:
        result = step(scores, inputs, embed, 1.0)
    with TransientTracker() as every_op, _PassThrough():
        again = step(scores, inputs, embed, 1.0)
    assert groups_once.peak == every_op.peak and groups_once.live == every_op.live
    assert torch.equal(result.next_canvas, again.next_canvas) and torch.equal(result.soft_embeds, again.soft_embeds)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_a_samplers_tiles_chunks_and_steps_count_each_group_size_once_and_peak_as_when_every_op_is_counted(impl):
    V, CL, H, n = 262_144, 8, 16, 5  # two positions a cache group; tiles of 2, 2, 1

    def two_steps(*modes) -> tuple[list[int], torch.Tensor]:
        embed = torch.randn(V, H, generator=torch.Generator().manual_seed(0))
        hidden = torch.randn(n, CL, H, generator=torch.Generator().manual_seed(1))
        sampler = TiledSampler(SamplerConfig(n, CL, V, embed, 1.0, memory=VirtualDevice("1GiB"), tiling=2, impl=impl,
                                             lm_head=LMHead(embed, 30.0), chunk_size=65_536))  # fmt: skip
        for slot in range(n):
            sampler.start_canvas(slot, SamplingParams(seed=slot, greedy=slot == 0), 0)
        peaks = []
        for _ in range(2):
            with contextlib.ExitStack() as stack:
                for mode in modes:
                    stack.enter_context(mode)
                peaks.append(sampler.step(None, range(n), hidden=hidden).plan.peak_transient_bytes)
        return peaks, sampler.canvas.clone()

    (once, canvas), (every_op, again) = two_steps(), two_steps(_PassThrough())
    assert once == every_op and torch.equal(canvas, again)


def test_a_charged_tile_that_no_longer_fits_is_split_as_a_counted_one_is():
    V, CL, H, n = 65_536, 8, 16, 4

    def two_steps(*modes) -> tuple[list[tuple], torch.Tensor]:
        embed = torch.randn(V, H, generator=torch.Generator().manual_seed(0))
        hidden = torch.randn(n, CL, H, generator=torch.Generator().manual_seed(1))
        device = VirtualDevice("64MiB")
        sampler = TiledSampler(SamplerConfig(n, CL, V, embed, 1.0, memory=device, tiling=2, lm_head=LMHead(embed, 30.0)))
        for slot in range(n):
            sampler.start_canvas(slot, SamplingParams(seed=slot), 0)
        plans = []
        for room in (None, sampler.calibration().tile_bytes(2) - 1):  # then a tile of 2 no longer fits
            if room is not None:
                device.reserve(device.free_bytes() - room, "another tab's run")
            with contextlib.ExitStack() as stack:
                for mode in modes:
                    stack.enter_context(mode)
                plan = sampler.step(None, range(n), hidden=hidden).plan
            plans.append((plan.tiles, [(s.start, s.size) for s in plan.splits], plan.peak_transient_bytes))
        return plans, sampler.canvas.clone()

    (once, canvas), (every_op, again) = two_steps(), two_steps(_PassThrough())
    assert once[1][1] == [(0, 2), (2, 2)] and once[1][0] == (1, 1, 1, 1)  # both tiles of 2 split, into ones
    assert once == every_op and torch.equal(canvas, again)


def test_a_repeated_body_that_would_cross_the_limit_runs_counted_and_fails_at_its_op():
    repeats, ran = Repeats(), []
    with TransientTracker(limit=7 * 1024 - 1) as tracker:  # a fourth body's 4 KiB on 3 kept does not fit
        kept = []
        for i in range(3):
            with repeats.body(1024) as keep:
                torch.ones(1024)  # 4 KiB, freed at once
                kept.append(torch.ones(256))  # 1 KiB, handed on
                keep(kept[-1])
                ran.append(i)
        assert tracker.live == 3 * 1024 and tracker.peak == 2 * 1024 + 4096  # the third body's, on two kept
        with pytest.raises(torch.OutOfMemoryError, match="out of memory: ones needs 4 KiB"):
            with repeats.body(1024):
                torch.ones(1024)
                ran.append(3)
        assert tracker.live == 3 * 1024 and tracker.peak == 2 * 1024 + 4096  # nothing was charged
    assert ran == [0, 1, 2]


def test_virtual_device_raises_out_of_memory_over_budget():
    device = VirtualDevice(4096)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        with device.measure():
            torch.ones(2048)  # 8 KiB > 4 KiB


def test_a_refused_allocation_is_not_counted():
    device = VirtualDevice(4096)
    with pytest.raises(torch.OutOfMemoryError):
        with device.measure():
            a = torch.ones(512)  # 2 KiB, fits
            torch.ones(2048)  # 8 KiB, refused
    del a
    assert device.peak_total == 2048
    assert device.free_bytes() == 4096


def test_host_memory_measures_only_when_asked():
    with HostMemory().measure() as quick:
        torch.ones(256)
    with HostMemory(track=True).measure() as tracked:
        torch.ones(256)
    assert quick.peak_bytes is None
    assert tracked.peak_bytes == 1024


def test_virtual_device_allows_allocations_under_budget():
    device = VirtualDevice(4096)
    with device.measure() as m:
        a = torch.ones(512)  # 2 KiB
        del a
        b = torch.ones(512)
        del b
    assert m.peak_bytes == 2048
    assert device.free_bytes() == 4096


def test_virtual_device_counts_resident_bytes_against_the_budget():
    device = VirtualDevice("1MiB")
    device.reserve(768 * 1024, "weights")
    assert device.free_bytes() == 256 * 1024
    with pytest.raises(torch.OutOfMemoryError, match="KV cache needs"):
        device.reserve(512 * 1024, "KV cache")
    with pytest.raises(torch.OutOfMemoryError):
        with device.measure():
            torch.ones(128 * 1024)  # 512 KiB of transient


@pytest.mark.parametrize("V", [3000, 262_144])  # all positions in one cache group; two a group
def test_calibration_on_meta_matches_the_real_step(V):
    CL, H = 16, 8
    calibration = calibrate_tile(reference_tile, CL, V, torch.empty(V, H))  # laid out as on a CPU
    logits = torch.randn(3, CL, V)
    embed = torch.randn(V, H)
    inputs = TileInputs(
        rows=[RowKey(seed=i, canvas_index=0, step=0) for i in range(3)],
        temperature=torch.ones(3),
        entropy_bound=torch.full((3,), 0.1),
        confidence_threshold=torch.full((3,), 0.005),
        last_step=torch.zeros(3, dtype=torch.bool),
        history=torch.full((3, 8, CL), -1),
        history_valid=torch.zeros(3, 8, dtype=torch.bool),
        group_bytes=group_bytes_for(embed.device),
    )
    real = measure_peak(lambda: reference_tile(Scores(logits=logits), inputs, embed, 1.0))
    assert real == pytest.approx(calibration.tile_bytes(3), rel=0.02)


def test_seed_step_holds_seven_fp32_copies_per_request_at_real_scale():
    calibration = calibrate_tile(seed_tile, 256, 262_144, torch.empty(262_144, 2816, dtype=torch.bfloat16, device="meta"))
    assert calibration.copies_per_request == pytest.approx(7.0, abs=0.05)
    # The source's figure: 16 requests need 28,672 MiB of transient memory.
    assert calibration.tile_bytes(16) / MiB == pytest.approx(28_672, rel=0.01)


def test_reference_step_holds_two_fp32_copies_per_request_at_real_scale_with_a_bf16_embedding():
    calibration = calibrate_tile(reference_tile, 256, 262_144, torch.empty(262_144, 2816, dtype=torch.bfloat16, device="meta"))
    # the tempered logits and their exponentials; the probabilities' bf16 cast for the matmul comes
    # after the tempered logits are freed (1 + 0.5 copies then)
    assert calibration.copies_per_request == pytest.approx(2.0, abs=0.05)


CAL = Calibration(bytes_per_request=100, fixed_bytes=20, canvas_length=1, vocab_size=25)


@pytest.mark.parametrize(
    "num_decode, free, fraction, group",
    [
        (16, 10_000, 0.5, 16),  # everything fits
        (16, 1_000, 0.5, 4),  # (500 - 20) // 100
        (16, 1_000, 1.0, 9),  # (1000 - 20) // 100
        (16, 130, 0.5, 1),  # one request fits in free memory, not in half of it: still one
        (3, 10**9, 0.5, 3),  # never more than the requests there are
    ],
)
def test_planner_arithmetic(num_decode, free, fraction, group):
    assert plan_tiles(num_decode, free, CAL, fraction) == group


@pytest.mark.parametrize("num_decode, group", [(16, 7), (32, 7), (8, 3), (64, 29), (5, 9), (7, 1), (16, 16)])
def test_auto_tiles_are_as_few_as_the_group_allows_and_even(num_decode, group):
    tiles = split_tiles(num_decode, group, even=True)
    sizes = [end - start for start, end in tiles]
    assert [start for start, _ in tiles] == [0] + [end for _, end in tiles[:-1]] and tiles[-1][1] == num_decode
    assert len(tiles) == len(split_tiles(num_decode, group)) == -(-num_decode // group)
    assert max(sizes) <= group and max(sizes) - min(sizes) <= 1


def test_planner_reports_bytes_needed_and_free_when_one_request_cannot_fit():
    with pytest.raises(torch.OutOfMemoryError, match="needs 120 B but only 119 B is free"):
        plan_tiles(4, 119, CAL)
    big = Calibration(bytes_per_request=2 * GiB, fixed_bytes=0, canvas_length=256, vocab_size=262_144)
    with pytest.raises(torch.OutOfMemoryError, match="needs 2.00 GiB but only 1.00 GiB is free"):
        plan_tiles(4, GiB, big)


def test_memory_for_picks_the_device():
    assert isinstance(memory_for("cpu"), HostMemory)
    assert isinstance(memory_for("cpu", "8GiB"), VirtualDevice)
    assert memory_for("cpu", "8GiB").capacity_bytes() == 8 * GiB


@pytest.mark.parametrize("name", ["tpu", "gpu0", "cuda"] if not torch.cuda.is_available() else ["tpu", "gpu0"])
def test_unknown_or_absent_devices_raise_one_clear_line(name):
    with pytest.raises(ValueError) as info:
        resolve_device(name)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- the C allocator

ROOT = Path(__file__).resolve().parents[1]

ARENA_PROBE = """
import ctypes, os, re, sys, tempfile, threading
if sys.argv[1] == "app":
    import app  # what `python app.py` runs first
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
together = threading.Barrier(8)
def allocate():
    blocks = [libc.malloc(4096) for _ in range(100)]
    together.wait()  # all eight threads hold memory at once
    for block in blocks:
        libc.free(block)
threads = [threading.Thread(target=allocate) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
path = tempfile.mktemp()
out = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, out)
libc.fclose(out)
with open(path) as report:
    print(len(re.findall(r'<heap nr="[0-9]+">', report.read())))
os.remove(path)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc arenas")
@pytest.mark.server  # a fresh interpreter per mode: arenas are set once, when a process starts
def test_the_app_caps_glibc_malloc_arenas_at_two_however_many_threads_allocate():
    def arenas(mode: str) -> int:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        run = subprocess.run([sys.executable, "-c", ARENA_PROBE, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return int(run.stdout.split()[-1])

    assert arenas("bare") > 2  # glibc's default: an arena per thread, up to eight per core
    assert arenas("app") == 2
