"""What Python objects hold in memory, counted from the objects themselves (torch-free).

The caps on what visitors keep (dgemma/serving/held_runs.py) count recordings and boards. Counting
them by `sys.getsizeof` of what they actually hold follows the interpreter and the data, where
hand-tuned bytes-per-item constants drift as the classes change.
"""

from __future__ import annotations

import sys
from dataclasses import fields, is_dataclass

# Objects every program shares, which a container's reference does not make it hold.
_SHARED = (type(None), bool, type)
_SMALL_INTS = range(-5, 257)  # CPython caches these
_LEAVES = (int, float, str, bytes, bool)  # hold no other object


def object_bytes(obj: object, seen: set[int] | None = None, shared: tuple[type, ...] = ()) -> int:
    """`sys.getsizeof` of `obj` and of every object it reaches through tuples, lists, sets, dicts and
    dataclass fields, each counted once: `seen` holds the ids already counted, so a caller that
    passes one set to several calls counts objects they share once. An array's, a bytes' or a
    string's buffer is inside its own getsizeof; None, bools and CPython's small ints count nothing,
    nor do the items of a container of one `shared` kind (say str: pieces that a table owns)."""
    seen = set() if seen is None else seen
    total = 0
    todo = [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, _SHARED) or (type(item) is int and item in _SMALL_INTS) or id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (tuple, list, set, frozenset)):
            kinds = set(map(type, item))
            if len(kinds) == 1 and (kind := kinds.pop()) in _LEAVES:
                # A canvas's ids, entropies or pieces: summed at C speed, not tracked one by one, since
                # a board holds tens of thousands (a leaf two such containers share counts twice).
                if kind is int:
                    item = [x for x in item if x not in _SMALL_INTS]
                total += sum(map(sys.getsizeof, item)) if kind is not bool and kind not in shared else 0
            else:
                todo.extend(item)
        elif is_dataclass(item):  # its getsizeof has its attributes' slots (inline values, or a dict of them)
            todo.extend(getattr(item, f.name) for f in fields(item))
    return total


