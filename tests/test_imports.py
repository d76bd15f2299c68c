"""The package's shape: no import cycles (imports inside functions count), no re-exports.

A cycle hidden by an import inside a function still means two modules cannot be understood,
tested or moved apart; a name importable from two places has no home. Both are read from
the source with `ast`, so the test needs nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

NMT = Path(__file__).resolve().parents[1] / "nmt"


def module_name(path: Path) -> str:
    parts = path.relative_to(NMT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in NMT.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The nmt modules `path` imports anywhere in its body (a package's `__init__` counts only
    where a name is imported from it and is not a submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= submodules or {node.module}
            if len(submodules) < len(node.names):
                found.add(node.module)
    found.discard(module_name(path))
    return found


def graph() -> dict[str, set[str]]:
    return {name: imported_modules(path) for name, path in MODULES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_nmt_has_no_import_cycles():
    cycle = find_cycle(graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_no_module_re_exports_a_name_it_imports():
    """`__all__` lists only what a module defines; `# re-exported` imports do not exist."""
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        assert "re-export" not in text, f"{name} re-exports names"
        tree = ast.parse(text)
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        defined |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                listed = {e.value for e in node.value.elts}  # type: ignore[attr-defined]
                assert listed <= defined, f"{name}.__all__ lists imported names: {sorted(listed - defined)}"


def test_subpackages_are_the_pipeline():
    """A subpackage per part of the pipeline, and the command line that drives them."""
    packages = {p.parent.name for p in NMT.glob("*/__init__.py")}
    assert packages == {"hw", "run", "data", "model", "export", "train", "decode", "serve", "cli"}
