"""The views pass values by name: no function under dgemma/ui/ takes more than 8 parameters (a
panel's settings go to a handler as one dict, `inputs_kwargs`, never one parameter each)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIEWS = ROOT / "dgemma" / "ui"
MAX_PARAMETERS = 8


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> int:
    a = node.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def too_many(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and parameters(node) > MAX_PARAMETERS:
            found[f"{path.name}:{node.lineno} {getattr(node, 'name', 'lambda')}"] = parameters(node)
    return found


def test_no_function_under_the_views_takes_more_than_eight_parameters():
    found = {k: n for path in sorted(VIEWS.rglob("*.py")) for k, n in too_many(path).items()}
    assert not found, f"functions over {MAX_PARAMETERS} parameters: {found}"


def test_the_count_catches_a_handler_with_a_parameter_per_setting(tmp_path):
    view = tmp_path / "view.py"
    view.write_text("def handler(a, b, c, d, e, f, g, h, *, i=1):\n    pass\n\ndef fine(a, b, *rest, **named):\n    pass\n")
    assert list(too_many(view).values()) == [9]
