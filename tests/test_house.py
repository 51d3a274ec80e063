"""The house keeps its shape: no import circles, no import from a lower layer to a higher one, no
import of another module's leading-underscore names (DESIGN.md section 1 and resolution 15).

Every import counts, at module level or inside a function (a lazy import is still a
dependency); imports under ``if TYPE_CHECKING:`` are type-only and do not. The
package's own ``__init__`` is the public face: it may re-export anything, and modules
above quantize may use it (``import anynum as an``).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "anynum"

#: DESIGN.md section 1, lowest first; modules of one layer may import each other (without circles).
LAYERS = {
    "errors": 0, "_bits": 0, "rounding": 1, "formats": 2, "kernels": 3, "quantize": 4,
    "ops": 5, "faults": 5, "nn": 5, "optim": 5, "emulate": 5, "mc": 5, "distributed": 5,
    "compat": 6, "experiments": 7, "cli": 8,
}  # fmt: skip
PUBLIC_FACE = "anynum"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return None if len(parts) < 2 else LAYERS.get(parts[1])


def _type_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        elif _type_only(child):
            for other in getattr(child, "orelse", []):
                found.extend(_imports(ast.Module(body=[other], type_ignores=[])))
        else:
            found.extend(_imports(child))
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the anynum modules it imports; and the private names imported across modules."""
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = []
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in mods else base)
                    private_name = alias.name.startswith("_") and not alias.name.startswith("__")
                    ours = base.split(".")[0] == PUBLIC_FACE  # torch's own privates are torch's business
                    if ours and private_name and full not in mods and owner(base) != mod:
                        private.append(f"{mod} imports {base}.{alias.name}")
            for target in targets:
                if target.split(".")[0] != PUBLIC_FACE:
                    continue
                dep = owner(target)
                if dep is not None and dep != mod:
                    edges[mod].add(dep)
    return edges, private


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in _modules() if m != PUBLIC_FACE and _layer(m) is None]
    assert not unplaced, f"modules outside DESIGN.md's layers: {unplaced}"


def test_no_import_circles() -> None:
    edges, _ = _graph()
    edges[PUBLIC_FACE] = set()  # the public face's imports are re-exports
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_no_upward_imports() -> None:
    edges, _ = _graph()
    upward = []
    for a, deps in edges.items():
        if a == PUBLIC_FACE:
            continue
        for b in deps:
            if b == PUBLIC_FACE:
                if (_layer(a) or 0) <= LAYERS["quantize"]:
                    upward.append(f"{a} -> the public face")
            elif (_layer(b) or 0) > (_layer(a) or 0):
                upward.append(f"{a} -> {b}")
    assert not sorted(upward), f"imports from a lower layer to a higher one: {sorted(upward)}"


def test_no_private_imports() -> None:
    _, private = _graph()
    assert not private, f"imports of another module's private names: {private}"


def test_modules_stay_small() -> None:
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in _modules().items()}
    big = {m: n for m, n in lines.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them by idea): {big}"


def test_the_checks_can_fail() -> None:
    """The reader finds what it is meant to find (a guard against a check that cannot fail)."""
    tree = ast.parse(
        "import typing\nif typing.TYPE_CHECKING:\n    from anynum.cli import main\n"
        "def f():\n    from anynum.nn import _private\n"
    )
    found = _imports(tree)
    assert [type(n).__name__ for n in found] == ["Import", "ImportFrom"]  # the TYPE_CHECKING one is skipped
    edges = {"a": {"b"}, "b": {"a"}}
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter(edges).static_order())
    order = [_layer(m) for m in ("anynum.formats.base", "anynum.kernels.route", "anynum.quantize.core")]
    assert order == [2, 3, 4]
