"""The house rules of the package layout (CONTRIBUTING.md): rooms import downward only, never each other,
no import cycles, and only ``storage/torchrl_compat.py`` touches private attributes of torchrl/tensordict.

Read from the source with :mod:`ast`, so a violation fails here with the file and line that broke it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "objectrl_buffer"

#: What each part of the package may import from the package (besides itself and ``errors``).
#: Lower layers first; a room may use any layer below it, never another room.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "core": set(),
    "storage": {"core"},
    "sampling": {"core"},
    "checkpoint": {"core", "storage"},
    "engine": {"core", "storage", "sampling", "checkpoint"},
    "forks": set(),  # the shared mode it hands buffers to is imported lazily (a room above)
    "persistence": {"core", "storage", "sampling", "checkpoint", "engine", "forks"},
    "reads": {"core", "storage", "sampling", "checkpoint", "engine"},
    "replay_buffer": {"core", "storage", "sampling", "checkpoint", "engine", "forks", "persistence", "reads"},
    "prioritized": {"core", "storage", "sampling", "checkpoint", "engine", "replay_buffer", "reads"},
    "her": {"core", "storage", "sampling", "checkpoint", "engine", "replay_buffer", "reads"},
    "cli": {"core", "storage", "checkpoint"},
    # upstream names over the rooms (RLinf, AWorld, AReaL): above every room, imported by nothing in the package
    "compat": {"core", "storage", "sampling", "checkpoint", "engine", "flow", "tasks", "trajectory", "async_buffer"},
    "__init__": {"*"},
    "__main__": {"cli"},
}
#: What any other folder (a room: tasks, trajectory, async_buffer, distributed, flow) may import.
ROOM_ALLOWED = {"core", "storage", "sampling", "checkpoint", "engine", "flow"}
#: Rooms beside the facade: none of them imports another.
ROOMS = {"prioritized", "her", "tasks", "trajectory", "async_buffer", "distributed", "flow"}
#: CLI: rooms inside commands (fast --help); forks: the shared mode; others: the facade, for typing
LAZY_OK = {"cli", "forks", "persistence", "reads"}


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, imported module, at top level)`` for every import of the package in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name == "objectrl_buffer" or name.startswith("objectrl_buffer."):
                found.append((node.lineno, name, id(node) in top))
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_rooms_import_downward_only() -> None:
    problems = []
    for path in _sources():
        part = _part(path)
        allowed = ALLOWED.get(part, ROOM_ALLOWED - {part})
        for line, name, top in _imports(path):
            parts = name.split(".")
            if len(parts) < 2:
                continue
            target = parts[1]
            if target in (part, "errors") or "*" in allowed:
                continue
            if not (PACKAGE / target).exists() and not (PACKAGE / f"{target}.py").exists():
                continue  # "from objectrl_buffer import ReplayBuffer": a name, checked as its module
            if target in allowed or (part in LAZY_OK and not top):
                continue
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({part}) imports {name}")
    assert not problems, "imports against the layout rules:\n" + "\n".join(problems)


def test_no_room_imports_another() -> None:
    problems = []
    for path in _sources():
        part = _part(path)
        if part not in ROOMS:
            continue
        for line, name, _ in _imports(path):
            target = name.split(".")[1] if "." in name else ""
            if target in ROOMS - ROOM_ALLOWED and target != part:  # flow is a room every room may use
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports the room {target}")
    assert not problems, "\n".join(problems)


def test_no_import_cycles() -> None:
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for _, imported, top in _imports(path):
            if not top:
                continue
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                deps.add(imported)
        graph[name] = deps
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            cycle = [*stack[stack.index(node) :], node]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            if dep.startswith(node + "."):
                continue  # a package importing its own submodules
            visit(dep, [*stack, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])


def test_only_the_adapter_touches_private_attributes_of_torchrl_and_tensordict() -> None:
    """``obj._name`` on anything but ``self``/``cls``/our own objects lives in ``storage/torchrl_compat.py``."""
    adapter = PACKAGE / "storage" / "torchrl_compat.py"
    problems = []
    for path in _sources():
        if path == adapter:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in {"self", "cls", "other", "os", "sys", "ctypes"}:
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} .{node.attr}")
    assert not problems, "private attribute access outside storage/torchrl_compat.py:\n" + "\n".join(problems)


def test_tests_poke_no_private_attributes() -> None:
    """Tests use the public API (the buffer's ``engine`` included); only the adapter test reads torchrl internals."""
    tests = Path(__file__).resolve().parents[1]
    problems = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in {"self", "cls", "os", "sys", "ctypes"}:
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            problems.append(f"{path.relative_to(tests.parent)}:{node.lineno} .{node.attr}")
    assert not problems, "tests reaching into private attributes:\n" + "\n".join(problems)


def test_nothing_in_the_package_imports_the_compatibility_modules() -> None:
    """``objectrl_buffer.compat`` sits above every room: loading the library never loads an upstream's names."""
    problems = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in _sources()
        if _part(path) != "compat"
        for line, name, _ in _imports(path)
        if name.split(".")[1:2] == ["compat"]
    ]
    assert not problems, "\n".join(problems)
