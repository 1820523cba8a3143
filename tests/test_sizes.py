"""What an object holds, counted from the objects themselves: within a few percent of what
tracemalloc sees allocated for it, shared objects once, the interpreter's own singletons never."""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass

from dgemma.sizes import object_bytes


@dataclass(frozen=True)
class Step:
    ids: tuple[int, ...]
    entropy: tuple[float, ...]
    accepted: tuple[bool, ...]


def steps(n: int) -> list[Step]:
    return [Step(tuple(range(1000 + i, 1256 + i)), tuple(0.5 + i + j for j in range(256)), (True, False) * 128)
            for i in range(n)]


def test_a_list_of_events_counts_what_tracemalloc_sees_allocated_for_it():
    tracemalloc.start()
    held = steps(64)
    allocated, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 0.9 * allocated <= object_bytes(held) <= 1.1 * allocated, (object_bytes(held), allocated)


def test_objects_two_calls_share_are_counted_once_with_one_seen_set():
    import sys

    shared = steps(4)
    first, second = {"kept": shared}, {"also": shared}
    seen: set[int] = set()
    assert object_bytes(first, seen) > 0
    assert object_bytes(second, seen) == sys.getsizeof(second) + sys.getsizeof("also")  # the second dict and its key


def test_none_bools_and_small_ints_count_nothing_and_a_shared_kind_counts_only_its_container():
    import sys

    assert object_bytes((None, True, 7)) == sys.getsizeof((None, True, 7))
    pieces = tuple(f"piece {i}" for i in range(100))
    assert object_bytes(pieces, shared=(str,)) == sys.getsizeof(pieces) < object_bytes(pieces)
