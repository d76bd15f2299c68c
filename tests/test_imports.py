"""The package's shape: no import cycles (imports inside functions count), rooms on floors that
import only downwards, no re-exports.

A cycle hidden by an import inside a function still means two modules cannot be understood,
tested or moved apart; two packages that import each other (data ↔ model) are one room in
two folders even without a cycle between their files; an arrow up the floors (hw importing
decode) puts a room below what it needs. A name importable from two places has no home. All
are read from the source with `ast`, so the test needs nothing imported.

The floors are docs/ARCHITECTURE.md's map, bottom up; a room is a subpackage, or a top-level
module of the ground floor.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

NMT = Path(__file__).resolve().parents[1] / "nmt"
SCRIPTS = NMT.parent / "scripts"


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


FLOORS: list[set[str]] = [
    {"nmt", "errors", "files", "contracts", "config_values", "config"},  # the ground: may import each other
    {"hw"},
    {"model"},
    {"run"},
    {"data", "batches"},
    {"export"},
    {"decode"},
    {"train", "serve"},
    {"pipeline"},
    {"cli"},
    {"__main__"},
]
GROUND = 0  # the one floor whose rooms may import each other (their files may not cycle)


def room(module: str) -> str:
    """The room of `module`: its subpackage ('nmt.data.vocab' → 'data'), else the module itself
    ('nmt.config' → 'config', the package 'nmt' → 'nmt')."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph `edges` seen from the rooms: room → the other rooms it imports."""
    rooms: dict[str, set[str]] = {}
    for module, imported in edges.items():
        rooms.setdefault(room(module), set()).update(room(m) for m in imported)
    return {r: deps - {r} for r, deps in rooms.items()}


def misplaced_arrows(edges: dict[str, set[str]], floors: list[set[str]]) -> list[str]:
    """Every room-level arrow of the module graph `edges` that breaks the floors: two rooms that
    import each other, an arrow to a room on a higher floor or to another room of its own floor
    (outside the ground), and rooms on no floor. [] when the house is in order."""
    floor = {r: i for i, rooms in enumerate(floors) for r in rooms}
    rooms = room_edges(edges)
    found = [f"{r} is on no floor" for r in sorted(rooms.keys() - floor.keys())]
    for a in sorted(rooms):
        for b in sorted(rooms[a]):
            if a < b and a in rooms.get(b, ()):
                found.append(f"{a} <-> {b}: two rooms import each other")
            if a in floor and b in floor and (floor[b] > floor[a] or (floor[b] == floor[a] != GROUND)):
                found.append(f"{a} -> {b}: an arrow up the floors ({a} on floor {floor[a]}, {b} on {floor[b]})")
    return found


def test_the_floor_checker_finds_two_way_and_upward_arrows():
    floors = [{"nmt", "config"}, {"model"}, {"batches"}, {"train", "serve"}]
    assert misplaced_arrows({"nmt.batches.batching": {"nmt.model.masks", "nmt.config"}}, floors) == []
    two_way = {"nmt.batches.batching": {"nmt.model.masks"}, "nmt.model.transformer": {"nmt.batches.batching"}}
    assert misplaced_arrows(two_way, floors) == [
        "batches <-> model: two rooms import each other",
        "model -> batches: an arrow up the floors (model on floor 1, batches on 2)",
    ]
    assert misplaced_arrows({"nmt.config": {"nmt.model.masks"}}, floors) == [
        "config -> model: an arrow up the floors (config on floor 0, model on 1)"
    ]
    assert misplaced_arrows({"nmt.serve.app": {"nmt.train.loop"}}, floors) == [
        "serve -> train: an arrow up the floors (serve on floor 3, train on 3)"
    ]
    assert misplaced_arrows({"nmt.export.argos": {"nmt.config"}}, floors) == ["export is on no floor"]


# Module arrows up the floors that are known and waiting for a home; each must still exist (a fixed
# one is taken off this list), and no other may appear.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def test_the_rooms_import_only_downwards():
    edges = graph()
    for (a, b), why in KNOWN_UPWARD.items():
        assert b in edges[a], f"{a} -> {b} no longer exists ({why}): take it off KNOWN_UPWARD"
        edges[a] = edges[a] - {b}
    wrong = misplaced_arrows(edges, FLOORS)
    assert not wrong, "\n".join(wrong)


def test_the_top_level_holds_only_the_ground_and_the_pipeline():
    """Every other module lives in a room (a subpackage)."""
    loose = {p.stem for p in NMT.glob("*.py")}
    assert loose == {"__init__", "__main__", "errors", "files", "contracts", "config", "config_values", "pipeline"}


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


def test_every_subpackage_is_a_room_on_a_floor():
    """A subpackage per part of the pipeline, the machine and the run directory below them, and
    the command line that drives them; each on one floor."""
    packages = {p.parent.name for p in NMT.glob("*/__init__.py")}
    assert packages == {"hw", "run", "data", "batches", "model", "export", "train", "decode", "serve", "cli"}
    assert packages <= set().union(*FLOORS)


# --------------------------------------------------------------------------- the run directory's names

RUN_VARIABLE = re.compile(r"(^|_)run(_dir)?$")  # run, run_dir, src.run_dir, checkpoint_run(...), reverse_run


def names_a_run(node: ast.expr) -> bool:
    """Whether `node` is, by its name, a run directory: a variable or attribute named like one, a
    call of a function named like one (`checkpoint_run(path)`), or `Path(...)` of either."""
    if isinstance(node, ast.Name):
        return bool(RUN_VARIABLE.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(RUN_VARIABLE.search(node.attr))
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "Path":
            return len(node.args) == 1 and names_a_run(node.args[0])
        return names_a_run(node.func)
    return False


def is_a_name(node: ast.expr) -> bool:
    """A string literal, an f-string or a constant (`TB_DIR`): a file or folder name."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Name) and node.id.isupper())


def hand_built_run_paths(source: str, own: frozenset[str] = frozenset()) -> list[int]:
    """The lines of `source` that join a name to a run directory by hand (`run_dir / "vocab"`)
    instead of asking `nmt.run.layout.RunDir`; the names in `own` (a script's own files that it
    keeps in a run it made) are not the run's."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        and names_a_run(node.left) and is_a_name(node.right)
        and not (isinstance(node.right, ast.Constant) and node.right.value in own)
    )  # fmt: skip


# A script's own files in the runs it makes, not a run's (so not RunDir's to name): the
# prepared.json of bench_train_memory records which synthetic data it wrote into a run.
SCRIPTS_OWN = {"scripts/bench_train_memory.py": frozenset({"prepared.json"})}


def test_the_run_path_finder_finds_names_joined_to_a_run():
    found = """
a = run_dir / "corpus" / f"train.{lang}"
b = Path(run_dir) / "vocab"
c = Path(src.run_dir) / "export"
d = checkpoint_run(path) / "vocab"
e = run / TB_DIR
"""
    assert hand_built_run_paths(found) == [2, 3, 4, 5, 6]
    fine = """
a = RunDir(run_dir).vocab_model("zh")
b = RunDir(run_dir).export / f"ct2-{name}"
c = ckpt_dir / "step_1.safetensors"
d = runner / "x"
e = run_dir / name
f = rerun_dir / "x"
"""
    assert hand_built_run_paths(fine) == []
    own = 'a = run / "prepared.json"\nb = run / "config.yaml"\n'
    assert hand_built_run_paths(own, frozenset({"prepared.json"})) == [2]
    assert hand_built_run_paths(own) == [1, 2]


def test_only_the_run_package_spells_a_run_directorys_names():
    """Every file and folder of a run is named once, by `nmt.run.layout.RunDir`; every module
    outside `nmt.run` asks it, and so does every script (scripts/*.py, entry points that may
    import nmt), but for its own files (SCRIPTS_OWN)."""
    scripts = sorted(SCRIPTS.glob("*.py"))
    assert scripts, f"no scripts in {SCRIPTS}"
    wrong = [
        f"{where}:{line}"
        for path in [p for name, p in sorted(MODULES.items()) if room(name) != "run"] + scripts
        for where in [path.relative_to(NMT.parent).as_posix()]
        for line in hand_built_run_paths(path.read_text(encoding="utf-8"), SCRIPTS_OWN.get(where, frozenset()))
    ]
    assert not wrong, "a run directory's path built by hand (use nmt.run.layout.RunDir): " + ", ".join(wrong)
