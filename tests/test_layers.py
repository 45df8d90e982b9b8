"""The layout's one rule, checked on the source: no module imports one on a higher floor.

The floors follow a message's path (docs/architecture.md): the `sprite-os` command on top, then the
socket (server.py), the connection (gateway.py and the console's requests), the runtime, the agent and
memory side by side, and under them all the stores and shared facts (settings, the wire format,
SQLite, paths). Imports only go down. The agent and memory know each other only through
agent/memory_port.py's protocols, so the runtime never imports memory/, even through another module,
and nothing in the product imports the dev kit (devkit/ is not shipped).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "os_src"  # the package sprite_os

# (floor, prefixes): a module is on the floor of the longest prefix it starts with.
FLOORS: dict[str, int] = {
    "commands": 5, "__main__": 5,
    "server": 4,
    "gateway": 3, "console": 3,
    "runtime": 2,
    "agent": 1, "isolation": 1, "tools": 1, "memory": 1,
    # the stores and shared facts
    "config": 0, "protocol": 0, "events": 0, "database": 0, "db_worker": 0,
    # the wire format's parts that protocol.py gathers (requests and their answers)
    "console.requests": 0, "console.memory_frames": 0, "console.session_frames": 0, "console.files_frames": 0,
    "console.card_frames": 0,
    "errors": 0, "logs": 0, "text": 0, "fsutil": 0, "paths": 0, "procfs": 0, "malloc_arenas": 0,
    "deploy_contract": 0, "stopping": 0, "spending": 0, "dates": 0, "backoff": 0, "metrics": 0, "turn_end": 0, "": 0,
}
# Side by side on the agent's floor, and apart: memory is reached through agent/memory_port.py.
APART = {("agent", "memory"), ("memory", "agent"), ("memory", "tools"), ("memory", "isolation"),
         ("isolation", "memory"), ("agent", "tools"),
         # and memory speaks no wire format: what clients see of it is the runtime's and the console's
         ("memory", "protocol"), ("memory", "console"), ("memory", "events")}


def module_name(path: Path, root: Path = SOURCE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


KITS = ("devkit", "tests", "bench", "chaos")  # what is not shipped


def imports(path: Path, root: Path = SOURCE) -> set[str]:
    """What `path` imports: the package's modules by their name inside it ("" for the package,
    relative imports resolved, TYPE_CHECKING ones too), and any kit by its full name."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    absolute: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            absolute |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            absolute.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            target = ".".join([*package[:len(package) - (node.level - 1)], *([node.module] if node.module else [])])
            for alias in node.names:  # `from .. import protocol` names a module; `from .x import f` does not
                sub = f"{target}.{alias.name}".lstrip(".")
                absolute.add("sprite_os." + (sub if is_module(sub, root) else target) if sub else "sprite_os")
    found = {m for m in absolute if m.split(".")[0] in KITS}
    return found | {m.removeprefix("sprite_os").lstrip(".") for m in absolute if m.split(".")[0] == "sprite_os"}


def is_module(name: str, root: Path = SOURCE) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or path.is_dir()


def floor(module: str) -> int:
    prefix = max((p for p in FLOORS if module == p or module.startswith(p + ".") or p == ""), key=len)
    return FLOORS[prefix]


@functools.cache  # parsed once a process: the tests below only read it
def graph(root: Path = SOURCE) -> dict[str, set[str]]:
    return {module_name(path, root): imports(path, root) for path in sorted(root.rglob("*.py"))}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among `edges`' modules (strongly connected components of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v] & edges.keys():
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_floor() -> None:
    unplaced = [m for m in graph() if floor(m) == 0 and m.split(".")[0] not in FLOORS]
    assert unplaced == [], "give new top-level modules a floor in FLOORS"


def test_no_module_imports_one_on_a_higher_floor() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                    if b.split(".")[0] not in KITS and floor(b) > floor(a))
    assert upward == []


def test_memory_and_the_agent_meet_only_through_the_port() -> None:
    crossing = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                      if (a.split(".")[0], b.split(".")[0]) in APART)
    assert crossing == []


def test_the_runtime_never_imports_memory_even_through_another_module() -> None:
    edges = graph()
    seen, todo = set(), ["runtime"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [m for m in edges.get(module, ()) if m in edges]
    assert sorted(m for m in seen if m.startswith("memory")) == []


@pytest.mark.parametrize("kit", KITS)
def test_the_product_imports_no_test_or_dev_kit(kit: str) -> None:
    assert sorted(a for a, targets in graph().items() if any(t.split(".")[0] == kit for t in targets)) == []


@pytest.mark.parametrize("root", [SOURCE, REPO / "devkit" / "mock_bridge"], ids=["sprite_os", "mock_bridge"])
def test_no_import_cycles(root: Path) -> None:
    """A circle (two modules that import each other, TYPE_CHECKING included) means two of them
    are one responsibility, or a type lives in the wrong one."""
    edges = graph(root)
    if root != SOURCE:  # the mock Bridge's modules import each other relatively, by their own names
        edges = {m: {t.removeprefix("sprite_os").lstrip(".") for t in ts} for m, ts in edges.items()}
    assert cycles(edges) == []


# Names every module of a kind defines for itself, by design (each in-process tool's server name).
OWN_NAMES = {"SERVER_NAME"}
KNOWN_COPIES: set[tuple[str, str]] = set()  # none left: memory/importer.py takes capture's MAX_TOOL_CALLS


def test_each_constant_is_defined_once() -> None:
    """A constant is one fact: defined in one module and imported where it is used. Two modules
    each with their own MAX_SUMMARIES (5 and 8), BUSY_TIMEOUT_MS or CHARS_PER_TOKEN drift apart
    silently; a limit that really differs gets a name that says how."""
    defined: dict[str, list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        where = str(path.relative_to(SOURCE))
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) and node.value is not None else []
            value = getattr(node, "value", None)
            is_type_variable = isinstance(value, ast.Call) and getattr(value.func, "id", "") == "TypeVar"
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_") \
                        and not is_type_variable and target.id not in OWN_NAMES and (target.id, where) not in KNOWN_COPIES:
                    defined.setdefault(target.id, []).append(where)
    assert {name: places for name, places in defined.items() if len(places) > 1} == {}
