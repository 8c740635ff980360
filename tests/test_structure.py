"""The package's import structure: layers point downward, no cycles, no private names across
modules. Read from the source with ``ast`` (nothing is imported), so a violation is reported
even where it sits inside a function that no test calls."""

from __future__ import annotations

import ast
import difflib
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "medfed"

# Importer (and every module under it) -> medfed packages it must never import.
LAYERS: tuple[tuple[str, str], ...] = (
    # medfed.<importer>, must not import medfed.<each of these>
    # The leaves every layer reads: nothing of medfed's outside them, not even the settings.
    (
        "core",
        "config data models algorithms federation routing clinic runs metrics reports "
        "experiments flower dashboard governance ops tracking cli",
    ),
    (
        "data",
        "models algorithms federation routing clinic runs metrics experiments flower dashboard",
    ),
    ("models", "data algorithms federation routing clinic runs experiments flower dashboard"),
    ("algorithms", "data federation runs routing clinic experiments flower dashboard"),
    # What training needs to route and evaluate: never the clinic's workflow.
    ("routing", "federation clinic experiments flower dashboard"),
    (
        "runs",
        "federation algorithms routing clinic experiments flower dashboard models data reports",
    ),
    ("reports", "federation algorithms experiments flower dashboard models data"),
    ("metrics", "models"),
    ("dashboard", "federation algorithms experiments"),
    ("federation", "clinic experiments flower dashboard"),
    # The clinical workflow (route, serve, review, audit, the PACS): it answers with a trained
    # federation, never trains one.
    ("clinic", "federation algorithms experiments flower dashboard"),
    # A SuperNode's gate decides on a message before anything heavy loads: no training code.
    (
        "governance",
        "federation algorithms models data routing clinic experiments flower dashboard reports",
    ),
    # What IT runs the services by (units, logs, metrics): below the services it runs.
    ("ops", "data models algorithms federation routing clinic experiments flower dashboard"),
    ("tracking", "federation algorithms experiments flower dashboard clinic.pacs governance"),
)

# Imported (a medfed package or a third-party distribution) -> the only importers allowed.
ONLY_FROM: tuple[tuple[str, str], ...] = (
    # imported, only by
    ("medfed.experiments", "medfed.cli medfed.experiments"),
    ("flwr", "medfed.flower medfed.cli"),
    ("streamlit", "medfed.dashboard medfed.cli"),
    ("plotly", "medfed.dashboard medfed.cli"),
    ("fastapi", "medfed.clinic"),
    ("uvicorn", "medfed.clinic medfed.cli"),
    ("pynetdicom", "medfed.clinic"),
    ("dicomweb_client", "medfed.clinic"),
    ("mlflow", "medfed.tracking"),
    ("medfed.tracking", "medfed.tracking medfed.cli"),
)

# The smallest leaves of medfed.core: what the site manifests and the settings may import.
SMALL_UTILITIES = (
    "medfed.core.errors medfed.core.versions medfed.core.names medfed.core.units "
    "medfed.core.devices medfed.core.kinds medfed.core.operating_rule medfed.core.reliability"
)

# Module -> the only medfed modules it may import (lazy imports count too).
ONLY_IMPORTS: tuple[tuple[str, str], ...] = (
    # module, may import only
    ("medfed.core.errors", ""),
    ("medfed.core.names", ""),
    ("medfed.core.units", ""),
    ("medfed.core.devices", ""),
    ("medfed.core.kinds", ""),
    ("medfed.core.operating_rule", ""),
    ("medfed.core.reliability", ""),
    ("medfed.core.normalization", ""),
    ("medfed.core.progress", ""),
    ("medfed.core.fileio", "medfed.core.errors"),
    ("medfed.core.versions", "medfed.core.errors"),
    ("medfed.core.manifest", SMALL_UTILITIES),  # site manifests: read by data and the settings
    (
        "medfed.config",
        f"{SMALL_UTILITIES} medfed.core.manifest",
    ),  # settings: what every layer reads
)

# Module (a package: every module under it) -> third-party packages that neither it nor any
# medfed module it imports may import. The run schema is read by the dashboard and report tools,
# which must not need torch; governance decides on a SuperNode's messages before torch loads.
TORCH_FREE: tuple[tuple[str, str], ...] = (
    # module, never imports (itself, or through what importing its medfed imports runs)
    ("medfed.runs.schema", "torch torchvision monai peft safetensors"),
    ("medfed.reports.study", "torch torchvision monai peft safetensors"),
    ("medfed.governance", "torch torchvision monai peft safetensors"),
)


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` by a module: a medfed module or a top-level third-party name."""

    target: str
    line: int
    internal: bool
    names: tuple[str, ...] = ()  # names taken with ``from target import ...`` (not submodules)
    lazy: bool = False  # inside a function: runs when the function is called
    type_only: bool = False  # under ``if TYPE_CHECKING:``: never runs
    implicit: bool = False  # a package __init__ that importing one of its modules runs first

    def where(self) -> str:
        notes = [f"line {self.line}"]
        notes += ["inside a function"] * self.lazy + ["type checking only"] * self.type_only
        notes += ["package __init__ run on the way to a submodule"] * self.implicit
        return ", ".join(notes)


@dataclass
class Tree:
    """Every medfed module and what it imports: the graph the rules below are checked on."""

    modules: dict[str, bool]  # name -> is a package (an __init__.py)
    edges: dict[str, list[Edge]] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Raw:
    module: str  # absolute, as written after resolving dots
    names: tuple[str, ...] | None  # None for ``import module``
    line: int
    lazy: bool
    type_only: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    """Every import statement of one module, at any depth, with its absolute module name."""

    def __init__(self, name: str, is_package: bool) -> None:
        self.package = name if is_package else name.rpartition(".")[0]
        self.found: list[_Raw] = []
        self.functions = 0
        self.type_checking = 0

    def _add(self, module: str, names: tuple[str, ...] | None, line: int) -> None:
        lazy, type_only = self.functions > 0, self.type_checking > 0
        self.found.append(_Raw(module, names, line, lazy, type_only))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions += 1
        self.generic_visit(node)
        self.functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.type_checking += 1
        for child in node.body:
            self.visit(child)
        self.type_checking -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, None, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            parts = self.package.split(".")
            base = parts[: len(parts) - (node.level - 1)]
            module = ".".join(base + ([module] if module else []))
        self._add(module, tuple(alias.name for alias in node.names), node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        # import_module("medfed.x") / __import__("medfed.x") with a literal name.
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self._add(first.value, None, node.lineno)
        self.generic_visit(node)


def _ancestors(name: str) -> Iterator[str]:
    """``a.b.c`` -> ``a``, ``a.b`` (the packages Python imports before ``a.b.c``)."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        yield ".".join(parts[:i])


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def build_tree(sources: Mapping[str, tuple[str, bool]]) -> Tree:
    """The import graph of ``{module name: (source, is_package)}``."""
    tree = Tree({name: is_pkg for name, (_, is_pkg) in sources.items()})
    for name, (source, is_package) in sorted(sources.items()):
        collector = _Collector(name, is_package)
        collector.visit(ast.parse(source, filename=name))
        edges: list[Edge] = []
        for raw in collector.found:
            flags = {"line": raw.line, "lazy": raw.lazy, "type_only": raw.type_only}
            if raw.module.split(".")[0] != "medfed":
                edges.append(Edge(raw.module.split(".")[0], internal=False, **flags))
                continue
            if raw.module not in tree.modules:
                tree.unresolved.append(f"{name} imports {raw.module} (line {raw.line})")
                continue
            targets: list[tuple[str, tuple[str, ...]]] = []
            if raw.names is None:
                targets.append((raw.module, ()))
            else:
                plain = tuple(n for n in raw.names if f"{raw.module}.{n}" not in tree.modules)
                subs = [f"{raw.module}.{n}" for n in raw.names if n not in plain]
                targets += [(sub, ()) for sub in subs]
                if plain or not subs:
                    targets.append((raw.module, plain))
            for target, names in targets:
                edges.append(Edge(target, internal=True, names=names, **flags))
                own = set(_ancestors(name)) | {name}
                for package in _ancestors(target):
                    if package not in own and package in tree.modules:
                        edges.append(Edge(package, internal=True, implicit=True, **flags))
        tree.edges[name] = edges
    return tree


def read_package(root: Path = PACKAGE_DIR) -> Tree:
    """The import graph of the medfed package on disk."""
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        sources[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return build_tree(sources)


# ------------------------------------------------------------------------------ the checks
def _runtime(tree: Tree, name: str) -> Iterable[Edge]:
    return (e for e in tree.edges.get(name, ()) if e.internal and not e.type_only)


def _components(tree: Tree) -> list[list[str]]:
    """Strongly connected components of the runtime graph (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in _runtime(tree, node):
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            found.append(sorted(component))

    for node in sorted(tree.modules):
        if node not in index:
            visit(node)
    return sorted((c for c in found if len(c) > 1), key=lambda c: (-len(c), c))


def _shortest_cycle(tree: Tree, members: list[str]) -> list[tuple[str, Edge]]:
    """One shortest cycle through the first member, as (importer, edge) steps."""
    start, inside = members[0], set(members)
    came: dict[str, tuple[str, Edge]] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in _runtime(tree, node):
            if edge.target == start:
                steps = [(node, edge)]
                while node != start:
                    prev, via = came[node]
                    steps.append((prev, via))
                    node = prev
                return steps[::-1]
            if edge.target in inside and edge.target not in came:
                came[edge.target] = (node, edge)
                queue.append(edge.target)
    return []


def find_cycles(tree: Tree) -> list[str]:
    """Each import cycle between medfed modules, spelled out edge by edge."""
    out = []
    for members in _components(tree):
        steps = _shortest_cycle(tree, members)
        chain = "; ".join(f"{src} imports {edge.target} ({edge.where()})" for src, edge in steps)
        out.append(f"cycle ({len(members)} modules tangled): {chain}")
    return out


def find_private_imports(tree: Tree) -> list[str]:
    """Imports of another module's ``_name`` (a private module only from inside its package)."""
    out = []
    for name, edges in tree.edges.items():
        for edge in edges:
            if not edge.internal or edge.implicit:
                continue
            for private in (n for n in edge.names if n.startswith("_") and not n.endswith("__")):
                if edge.target != name:
                    out.append(f"{name} imports {private} from {edge.target} ({edge.where()})")
            parts = edge.target.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not _under(name, ".".join(parts[:i])):
                    out.append(f"{name} imports private module {edge.target} ({edge.where()})")
                    break
    return out


def find_layer_violations(tree: Tree) -> list[str]:
    """Imports against LAYERS or ONLY_FROM (lazy and type-checking imports count too)."""
    out = []
    for name, edges in tree.edges.items():
        for edge in edges:
            if edge.implicit:
                continue
            for importer, forbidden in LAYERS:
                if not _under(name, f"medfed.{importer}"):
                    continue
                for layer in forbidden.split():
                    if _under(edge.target, f"medfed.{layer}"):
                        out.append(
                            f"{name} imports {edge.target} ({edge.where()}): "
                            f"medfed.{importer} must not import medfed.{layer}"
                        )
            for imported, allowed in ONLY_FROM:
                if _under(edge.target, imported) and not any(
                    _under(name, a) for a in allowed.split()
                ):
                    out.append(
                        f"{name} imports {edge.target} ({edge.where()}): only "
                        f"{', '.join(allowed.split())} may import {imported}"
                    )
    return out


def find_imports_beyond(tree: Tree, module: str, allowed: Iterable[str]) -> list[str]:
    """Imports by ``module`` of medfed modules outside ``allowed`` (the medfed package's own
    ``__init__``, run on the way to any of them, aside)."""
    allowed = set(allowed)
    return [
        f"{module} imports {edge.target} ({edge.where()}): it may import only "
        f"{', '.join(sorted(allowed)) or 'no medfed module'}"
        for edge in tree.edges.get(module, ())
        if edge.internal
        and not edge.implicit
        and edge.target != "medfed"
        and edge.target not in allowed
    ]


def find_forbidden_reach(tree: Tree, module: str, forbidden: Iterable[str]) -> list[str]:
    """Third-party ``forbidden`` packages that ``module`` pulls in, with the path.

    That is: its own imports, lazy ones too (its functions may run them), then what importing
    those modules runs, package ``__init__``s included. Another module's function-level imports
    are not followed: they keep the heavy package out until that function is called.
    """
    forbidden = set(forbidden)
    starts = [p for p in (*_ancestors(module), module) if p in tree.modules]
    came: dict[str, tuple[str, Edge] | None] = dict.fromkeys(starts)
    queue = deque(starts)
    reported: set[tuple[str, str]] = set()
    out = []
    while queue:
        node = queue.popleft()
        for edge in tree.edges.get(node, ()):
            if edge.type_only or (edge.lazy and node != module):
                continue
            if edge.internal:
                if edge.target not in came:
                    came[edge.target] = (node, edge)
                    queue.append(edge.target)
                continue
            if edge.target in forbidden and (node, edge.target) not in reported:
                reported.add((node, edge.target))
                path, step = [f"{node} imports {edge.target} ({edge.where()})"], node
                while came[step] is not None:
                    prev, via = came[step]  # type: ignore[misc]
                    path.append(f"{prev} imports {step} ({via.where()})")
                    step = prev
                out.append(f"{module} reaches {edge.target}: " + "; ".join(reversed(path)))
    return out


def _report(title: str, problems: list[str]) -> str:
    return f"{len(problems)} {title}:\n  " + "\n  ".join(problems)


# ------------------------------------------------------------------------------ the tree
@pytest.fixture(scope="module")
def tree() -> Tree:
    return read_package()


def test_every_medfed_import_names_a_module(tree: Tree) -> None:
    assert not tree.unresolved, _report("imports of missing medfed modules", tree.unresolved)


def test_no_import_cycles(tree: Tree) -> None:
    cycles = find_cycles(tree)
    assert not cycles, _report("import cycles between medfed modules", cycles)


def test_no_private_names_across_modules(tree: Tree) -> None:
    private = find_private_imports(tree)
    assert not private, _report("imports of another module's private name", private)


def test_layers_point_downward(tree: Tree) -> None:
    violations = find_layer_violations(tree)
    assert not violations, _report("imports against the layer rules", violations)


@pytest.mark.parametrize(("module", "allowed"), ONLY_IMPORTS)
def test_module_imports_only_what_it_may(tree: Tree, module: str, allowed: str) -> None:
    assert module in tree.modules, f"{module} is listed in ONLY_IMPORTS but does not exist"
    beyond = find_imports_beyond(tree, module, allowed.split())
    assert not beyond, _report(f"imports by {module} beyond what it may import", beyond)


@pytest.mark.parametrize(("module", "forbidden"), TORCH_FREE)
def test_module_stays_torch_free(tree: Tree, module: str, forbidden: str) -> None:
    assert module in tree.modules, f"{module} is listed in TORCH_FREE but does not exist"
    reach = [
        way
        for name in sorted(tree.modules)
        if _under(name, module)
        for way in find_forbidden_reach(tree, name, forbidden.split())
    ]
    assert not reach, _report(f"ways importing {module} imports {forbidden}", reach)


# ------------------------------------------------------------------------------ the checker
SYNTHETIC = {
    "medfed": ("", True),
    "medfed.data": ("from medfed.data.io import read\n", True),
    "medfed.data.io": ("def read():\n    from medfed.models.net import Net\n", False),
    "medfed.models": ("from . import net\n", True),
    "medfed.models.net": ("from medfed.data.io import read\nimport numpy\n", False),
    "medfed.runs": ("", True),
    "medfed.runs.rundir": (
        "import torch\nfrom ..data.io import _cache\ndef load():\n    import monai\n",
        False,
    ),
    "medfed.runs.schema": (
        "from typing import TYPE_CHECKING\nfrom . import rundir\n"
        "def f():\n    import safetensors\n",
        False,
    ),
    "medfed.routing": ("if TYPE_CHECKING:\n    from medfed.experiments import bench\n", True),
    "medfed.experiments": ("", True),
    "medfed.experiments.bench": ("import flwr.app\n", False),
}


def test_checker_reports_cycles_forbidden_edges_private_names_and_torch() -> None:
    tree = build_tree(SYNTHETIC)
    assert not tree.unresolved

    (cycle,) = find_cycles(tree)
    # data -> data.io -> models.net (lazy) -> data (its __init__, run to reach data.io).
    assert cycle.startswith("cycle (4 modules tangled): medfed.data imports medfed.data.io")
    assert "medfed.data.io imports medfed.models.net (line 2, inside a function)" in cycle
    assert "medfed.models.net imports medfed.data (line 1, package __init__" in cycle

    layers = find_layer_violations(tree)
    assert any(
        v.startswith("medfed.data.io imports medfed.models.net (line 2, inside a function)")
        and "medfed.data must not import medfed.models" in v
        for v in layers
    ), layers
    assert any(v.startswith("medfed.runs.rundir imports medfed.data.io") for v in layers), layers
    assert any(v.startswith("medfed.routing imports medfed.experiments.bench") for v in layers), (
        layers
    )
    assert any("medfed.experiments.bench imports flwr" in v for v in layers), layers
    assert not any(v.startswith("medfed.models.net imports numpy") for v in layers)

    private = find_private_imports(tree)
    assert private == ["medfed.runs.rundir imports _cache from medfed.data.io (line 2)"]

    assert find_imports_beyond(tree, "medfed.runs.schema", ["medfed.runs"]) == [
        "medfed.runs.schema imports medfed.runs.rundir (line 2): it may import only medfed.runs"
    ]

    # rundir's own lazy monai import is not followed; the schema's own lazy import is.
    safetensors, torch = sorted(
        find_forbidden_reach(tree, "medfed.runs.schema", ("torch", "monai", "safetensors"))
    )
    assert torch == (
        "medfed.runs.schema reaches torch: medfed.runs.schema imports medfed.runs.rundir "
        "(line 2); medfed.runs.rundir imports torch (line 1)"
    )
    assert safetensors == (
        "medfed.runs.schema reaches safetensors: "
        "medfed.runs.schema imports safetensors (line 4, inside a function)"
    )


def test_checker_accepts_a_clean_tree_and_package_self_imports() -> None:
    clean = {
        "medfed": ("", True),
        "medfed.data": ("from medfed.data.io import read\n__all__ = ['read']\n", True),
        "medfed.data._impl": ("def helper():\n    pass\n", False),
        "medfed.data.io": (
            "from medfed.data import _impl\nimport numpy\ndef f():\n    import torch\n",
            False,
        ),
        "medfed.routing": ("from medfed.data import io\n", True),
    }
    tree = build_tree(clean)
    assert find_cycles(tree) == []
    assert find_private_imports(tree) == []
    assert find_layer_violations(tree) == []
    assert find_forbidden_reach(tree, "medfed.routing", ("torch",)) == []


# ------------------------------------------------------------------------------ sizes
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 800

# Offenders allowed for now, each with why: "path" for a module, "path::name" for a function
# (a method as Class.name, a nested function as outer.name). A listed one that no longer
# offends fails the test too, so the list only shrinks.
SIZE_EXCEPTIONS: dict[str, str] = {}


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function under ``node`` as (qualified name, lines from ``def`` to its end)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child.end_lineno - child.lineno + 1  # type: ignore[operator]
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def find_oversized(sources: Mapping[str, str]) -> dict[str, int]:
    """``{"path": lines}`` for modules and ``{"path::name": lines}`` for functions too long."""
    out = {}
    for path, source in sources.items():
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            out[path] = lines
        for name, length in _functions(ast.parse(source, filename=path)):
            if length > MAX_FUNCTION_LINES:
                out[f"{path}::{name}"] = length
    return out


def test_no_function_over_100_lines_and_no_module_over_800() -> None:
    sources = {
        path.relative_to(PACKAGE_DIR).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
    }
    oversized = find_oversized(sources)

    new = [
        f"{name} ({n} lines)"
        for name, n in sorted(oversized.items())
        if name not in SIZE_EXCEPTIONS
    ]
    fixed = [name for name in SIZE_EXCEPTIONS if name not in oversized]
    assert not new, _report(
        f"modules over {MAX_MODULE_LINES} lines or functions over {MAX_FUNCTION_LINES} "
        "(split them)",
        new,
    )
    assert not fixed, _report(
        "size exceptions that no longer offend (drop them from SIZE_EXCEPTIONS)", fixed
    )
    assert all(SIZE_EXCEPTIONS.values()), "every size exception says why"


def test_size_checker_names_long_modules_and_functions() -> None:
    def body(n: int) -> str:
        return "\n".join(["        x = 1"] * n)

    # A.long: its def and 100 lines (101); short: 100 lines with its nested function.
    source = f"class A:\n    def long(self):\n{body(100)}\n\n\n"
    source += f"def short():\n    def inner():\n{body(98)}\n"
    found = find_oversized({"m.py": source, "big.py": "x = 1\n" * 801})
    assert found == {"m.py::A.long": 101, "big.py": 801}


# ---------------------------------------------------------------------------- the map
ARCHITECTURE = PACKAGE_DIR.parent / "docs" / "architecture.md"
RULES_MARKER = "structure-rules"
# A row of the page's map: | `medfed/PART` | its job | what is in it |
PART_ROW = re.compile(r"^\| `medfed/([\w.]+/?)` \|(.*)\|\s*$", re.MULTILINE)
MODULE_NAME = re.compile(r"\b\w+\.py\b")


def parts(root: Path = PACKAGE_DIR) -> list[str]:
    """medfed's parts as the page's map names them: each package (``data/``) and each module
    beside them (``config.py``)."""
    return sorted(
        f"{p.name}/" if p.is_dir() else p.name
        for p in root.iterdir()
        if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"
    )


def _names(text: str) -> str:
    return ", ".join(f"`{n}`" for n in text.split()) or "nothing of medfed's"


def rules_markdown(root: Path = PACKAGE_DIR) -> str:
    """The rules this test enforces, as docs/architecture.md states them: one row per rule, and
    one for each part no rule names as an importer (so that a new part changes the table)."""
    rows = ["| rule | what | never |", "| --- | --- | --- |"]
    for importer, forbidden in LAYERS:
        rows.append(
            f"| layer | `medfed.{importer}` (every module under it) | {_names(forbidden)} |"
        )
    for imported, importers in ONLY_FROM:
        rows.append(f"| only from | `{imported}` | imported by anything but {_names(importers)} |")
    for module, allowed in ONLY_IMPORTS:
        never = f"any medfed module but {_names(allowed)}" if allowed else "any medfed module"
        rows.append(f"| leaf | `{module}` | {never} |")
    for module, forbidden in TORCH_FREE:
        package = (root / Path(*module.split(".")[1:]) / "__init__.py").is_file()
        what = "every module under it, and what they import" if package else "and what it imports"
        rows.append(f"| torch-free | `{module}` ({what}) | {_names(forbidden)} |")
    ruled = {f"medfed.{i}" for i, _ in LAYERS} | {m for m, _ in ONLY_IMPORTS}
    for part in parts(root):
        name = "medfed." + part.removesuffix("/").removesuffix(".py")
        if name not in ruled and name != "medfed.__init__":
            under = " (every module under it)" if part.endswith("/") else ""
            rows.append(
                f"| none | `{name}`{under} | no rule of its own: the only-from rows, no cycles "
                "and no private names still hold |"
            )
    return "\n".join(rows)


def _section(text: str, marker: str) -> str:
    start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_the_architecture_page_states_the_rules_this_test_enforces() -> None:
    stated = _section(ARCHITECTURE.read_text(encoding="utf-8"), RULES_MARKER)
    enforced = rules_markdown()
    diff = difflib.unified_diff(
        stated.splitlines(),
        enforced.splitlines(),
        "docs/architecture.md",
        "the tables",
        lineterm="",
    )
    assert stated == enforced, (
        "docs/architecture.md's structure-rules section differs from this test's tables; "
        "write it again: python -c 'from tests.test_structure import write_rules; write_rules()'"
        "\n" + "\n".join(diff)
    )


def map_problems(text: str, root: Path = PACKAGE_DIR) -> list[str]:
    """What the page's map (one row per part) misses or names wrongly: a part without a row or
    a job, a row for no part, a subpackage its package's row does not name, a module named in
    a package's row that is not in it."""
    rows = {m.group(1): m.group(2).split("|") for m in PART_ROW.finditer(text)}
    on_disk = parts(root)
    out = [f"medfed/{p} has no row" for p in on_disk if p not in rows]
    out += [f"the row of medfed/{p} names no part on disk" for p in rows if p not in on_disk]
    for part, cells in sorted(rows.items()):
        if not cells[0].strip():
            out.append(f"the row of medfed/{part} says no job")
        if part not in on_disk or not part.endswith("/"):
            continue
        folder, row = root / part, "|".join(cells)
        for init in sorted(folder.rglob("*/__init__.py")):
            sub = init.parent.relative_to(folder).as_posix()
            if f"{sub}/" not in row:
                out.append(f"the row of medfed/{part} does not name its subpackage {sub}/")
        modules = {p.name for p in folder.rglob("*.py")}
        out += [
            f"the row of medfed/{part} names {name}, which is not in it"
            for name in sorted(set(MODULE_NAME.findall(row)) - modules)
        ]
    return out


def test_the_architecture_page_maps_every_part() -> None:
    problems = map_problems(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not problems, _report("problems of docs/architecture.md's map of the parts", problems)


def test_the_map_check_names_a_missing_part_and_a_stale_module(tmp_path: Path) -> None:
    for folder in ("medfed/data/layouts", "medfed/ops", "medfed/kiosk"):
        (tmp_path / folder).mkdir(parents=True)
    for module in ("data/__init__", "data/io", "data/layouts/__init__", "ops/__init__", "units"):
        (tmp_path / "medfed" / f"{module}.py").write_text("", encoding="utf-8")
    (tmp_path / "medfed" / "kiosk" / "__init__.py").write_text("", encoding="utf-8")
    page = (
        "| part | its job | what is in it |\n| --- | --- | --- |\n"
        "| `medfed/data/` | site data | `io.py`, `cache.py` |\n"
        "| `medfed/units.py` |  | |\n"
        "| `medfed/tracking/` | MLflow | |\n"
    )

    problems = map_problems(page, tmp_path / "medfed")
    rules = rules_markdown(tmp_path / "medfed")

    assert problems == [
        "medfed/kiosk/ has no row",
        "medfed/ops/ has no row",
        "the row of medfed/tracking/ names no part on disk",
        "the row of medfed/data/ does not name its subpackage layouts/",
        "the row of medfed/data/ names cache.py, which is not in it",
        "the row of medfed/units.py says no job",
    ]
    # A new part without a rule of its own changes the rules table too; a ruled one does not.
    assert "| none | `medfed.kiosk` (every module under it) | no rule of its own" in rules
    assert "| none | `medfed.ops`" not in rules


def write_rules() -> None:
    """Write the structure-rules section of docs/architecture.md from this test's tables."""
    from medfed.reports.markdown import replace_marked_section

    text = ARCHITECTURE.read_text(encoding="utf-8")
    ARCHITECTURE.write_text(
        replace_marked_section(text, RULES_MARKER, rules_markdown()), encoding="utf-8"
    )
