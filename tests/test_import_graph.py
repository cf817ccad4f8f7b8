"""The package's import boundaries, read statically from the source (nothing is imported).

- The runtime (everything under ``overlay/deepinfer_sm80``) never imports the developer
  tools (``tools``), the tests or the benchmarks.
- ``ops`` never imports vLLM: each op is a standalone kernel the plugin binds into vLLM.
- ``deploy`` runs on any host: what it imports when loaded, followed through the package
  (parent ``__init__`` files included), reaches neither torch, vLLM nor the plugin. An
  import inside a function is allowed only for an optional feature listed in
  ``DEPLOY_LAZY_ALLOWED``.
- No module imports a private name (leading underscore) from an op folder
  (``ops/<op>/``) other than its own: what two ops share lives in a shared module.
- No import cycles among the package's modules, counting imports inside functions.
- The deploy flow runs one way: ``topology`` (load, validate) imports ``planner`` (its
  plan), ``launcher`` (render) imports ``topology`` (what it renders is a validation) and
  ``cli`` drives them all; no step imports a later one (``DEPLOY_FLOW``), inside a
  function or not.

Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "deepinfer_sm80"

# Layers of the repository that the installed package must never import (test harnesses
# live in tools/, never in a ``testing`` package inside the runtime).
NOT_RUNTIME = ("tools", "tests", "benchmarks", f"{PACKAGE}.testing")
DEPLOY_FORBIDDEN = ("torch", "vllm", f"{PACKAGE}.vllm_plugin")
# (importer, imported module): imports inside a function that deploy may make.
DEPLOY_LAZY_ALLOWED = {
    # `deepinfer doctor --patches` prints the plugin's patch ledger; only that flag loads it.
    (f"{PACKAGE}.deploy.cli", f"{PACKAGE}.vllm_plugin.ledger"),
}
# The deploy flow's modules, each step after the ones it builds on: validation computes
# the plan, rendering takes the validation, the CLI runs load -> validate -> plan ->
# render. A module may import the steps before it, never one after it.
DEPLOY_FLOW = tuple(f"{PACKAGE}.deploy.{m}" for m in ("planner", "topology", "launcher", "cli"))


@dataclass(frozen=True)
class Import:
    importer: str
    module: str  # the imported module, resolved to its full dotted name
    name: str | None  # the name taken from it (``from module import name``), else None
    lazy: bool  # inside a function: runs when called, not when the importer loads
    line: int


@dataclass(frozen=True)
class Source:
    text: str
    is_package: bool  # an ``__init__.py``


def package_sources(root: Path, package: str) -> dict[str, Source]:
    """Module name -> source of every ``.py`` file under ``root/package``."""
    sources = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        sources[".".join(parts)] = Source(path.read_text(), is_package)
    return sources


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, source: Source, modules: set[str]) -> list[Import]:
    """Every import ``name`` makes; ``from a import b`` resolves to module ``a.b`` when
    that is one of ``modules``."""
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit_stmt(stmt, lazy)
                continue
            visit_stmt(child, lazy)

    def visit_stmt(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(name, alias.name, None, lazy, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if source.is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in modules:
                    found.append(Import(name, sub, None, lazy, node.lineno))
                else:
                    found.append(Import(name, module, alias.name, lazy, node.lineno))
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        visit(node, inner)

    visit(ast.parse(source.text), False)
    return found


def _top(module: str, prefixes: tuple[str, ...]) -> str | None:
    return next((p for p in prefixes if module == p or module.startswith(p + ".")), None)


def _op_folder(module: str, packages: set[str]) -> str | None:
    """``deepinfer_sm80.ops.mhc.warmup`` (or ``deepinfer_sm80.ops.mhc``) -> ``mhc``; None
    outside an op folder (``deepinfer_sm80.ops.registry`` is in none)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != [PACKAGE, "ops"]:
        return None
    if len(parts) > 3 or module in packages:
        return parts[2]
    return None


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def runtime_imports_tools(graph: list[Import]) -> list[str]:
    return [
        f"{i.importer}:{i.line} imports {i.module} (not part of the installed package)"
        for i in graph
        if _top(i.module, NOT_RUNTIME)
    ]


def ops_imports_vllm(graph: list[Import]) -> list[str]:
    return [
        f"{i.importer}:{i.line} imports {i.module}"
        for i in graph
        if i.importer.startswith(f"{PACKAGE}.ops") and _top(i.module, ("vllm",))
    ]


def deploy_reaches_forbidden(graph: list[Import], modules: set[str]) -> list[str]:
    """deploy's load-time import closure, and its function-level imports not allowed."""
    eager: dict[str, list[Import]] = {}
    for i in graph:
        if not i.lazy:
            eager.setdefault(i.importer, []).append(i)
    problems = []
    for i in graph:
        if i.lazy and i.importer.startswith(f"{PACKAGE}.deploy"):
            bad = _top(i.module, DEPLOY_FORBIDDEN)
            if bad and (i.importer, i.module) not in DEPLOY_LAZY_ALLOWED:
                problems.append(
                    f"{i.importer}:{i.line} imports {i.module} inside a function; add it to "
                    "DEPLOY_LAZY_ALLOWED only for an optional feature"
                )
    for start in sorted(m for m in modules if m.startswith(f"{PACKAGE}.deploy")):
        chain = {start: [start]}
        todo = [start, *[p for p in _parents(start) if p in modules]]
        for p in todo[1:]:
            chain[p] = [start, p]
        while todo:
            current = todo.pop()
            for i in eager.get(current, []):
                bad = _top(i.module, DEPLOY_FORBIDDEN)
                if bad:
                    via = " -> ".join([*chain[current], i.module])
                    problems.append(f"{start} loads {bad}: {via} (line {i.line})")
                    continue
                for nxt in [*_parents(i.module), i.module]:
                    if nxt in modules and nxt not in chain:
                        chain[nxt] = [*chain[current], nxt]
                        todo.append(nxt)
    return sorted(set(problems))


def deploy_flow_backwards(graph: list[Import]) -> list[str]:
    """Imports of a later step of the deploy flow (``DEPLOY_FLOW``), lazy ones included."""
    order = {m: i for i, m in enumerate(DEPLOY_FLOW)}
    return [
        f"{i.importer}:{i.line} imports {i.module}, a later step of the deploy flow "
        f"({' -> '.join(m.rsplit('.', 1)[-1] for m in DEPLOY_FLOW)})"
        for i in graph
        if i.importer in order and i.module in order and order[i.module] > order[i.importer]
    ]


def private_names_across_ops(graph: list[Import], packages: set[str]) -> list[str]:
    problems = []
    for i in graph:
        owner = _op_folder(i.module, packages)
        if owner is None or owner == _op_folder(i.importer, packages):
            continue
        private_module = any(p.startswith("_") for p in i.module.split(".")[3:])
        if private_module or (i.name or "").startswith("_"):
            what = f"{i.module}.{i.name}" if i.name else i.module
            problems.append(
                f"{i.importer}:{i.line} imports {what}, private to ops/{owner}; make it public "
                "in a module both share"
            )
    return problems


def cycles(graph: list[Import], modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for i in graph:
        if i.module in modules and i.module != i.importer:
            edges[i.importer].add(i.module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def check(sources: dict[str, Source]) -> list[str]:
    """Every boundary the sources break, one line each (empty: all hold)."""
    modules = set(sources)
    packages = {name for name, src in sources.items() if src.is_package}
    graph = [i for name, src in sources.items() for i in imports_of(name, src, modules)]
    return [
        *runtime_imports_tools(graph),
        *ops_imports_vllm(graph),
        *deploy_reaches_forbidden(graph, modules),
        *deploy_flow_backwards(graph),
        *private_names_across_ops(graph, packages),
        *(f"import cycle: {' -> '.join(c)}" for c in cycles(graph, modules)),
    ]


# ---------------------------------------------------------------------------- the tests


def test_package_keeps_its_import_boundaries():
    sources = package_sources(REPO / "overlay", PACKAGE)
    assert f"{PACKAGE}.ops.registry" in sources and f"{PACKAGE}.deploy.cli" in sources
    assert set(DEPLOY_FLOW) <= set(sources)
    assert check(sources) == []


def test_deploy_flow_steps_import_the_steps_before_them():
    """validate plans at module level (no import hidden in a function), render builds on
    validation: the flow's edges exist, so the order rule checks real imports."""
    sources = package_sources(REPO / "overlay", PACKAGE)
    graph = [i for n, s in sources.items() for i in imports_of(n, s, set(sources))]
    edges = {(i.importer, i.module) for i in graph if not i.lazy}
    deploy = f"{PACKAGE}.deploy"
    for importer, module in (
        ("topology", "planner"),
        ("launcher", "topology"),
        ("cli", "topology"),
        ("cli", "launcher"),
        ("cli", "planner"),
    ):
        assert (f"{deploy}.{importer}", f"{deploy}.{module}") in edges, (importer, module)


def test_tools_take_no_private_names_from_ops():
    """The developer tools use what the ops make public, as any other caller would."""
    package = package_sources(REPO / "overlay", PACKAGE)
    packages = {name for name, src in package.items() if src.is_package}
    tools = package_sources(REPO, "tools")
    graph = [i for name, src in tools.items() for i in imports_of(name, src, set(package))]
    assert private_names_across_ops(graph, packages) == []


def _synthetic(**modules: str) -> dict[str, Source]:
    """A made-up package: keyword ``ops__a__k`` is module ``deepinfer_sm80.ops.a.k``."""
    out = {PACKAGE: Source("", True), f"{PACKAGE}.ops": Source("", True)}
    for key, text in modules.items():
        name = f"{PACKAGE}.{key.replace('__', '.')}"
        out[name] = Source(text, False)
    return out


GOOD = dict(
    deploy__cli="from deepinfer_sm80.deploy import plan\n"
    "def doctor():\n    from deepinfer_sm80.vllm_plugin.ledger import format_ledger\n",
    deploy__plan="import yaml\nfrom deepinfer_sm80 import arch\n",
    arch="X = 1\n",
    ops__a__k="from deepinfer_sm80.ops.shared import helper\nfrom . import ref\n",
    ops__a__ref="import torch\n",
    ops__b__k="from deepinfer_sm80.ops.shared import helper\nfrom deepinfer_sm80.ops.a import k\n",
    ops__shared="import triton\nhelper = 1\n",
)


def test_synthetic_good_graph_passes():
    sources = _synthetic(**GOOD)
    sources[f"{PACKAGE}.deploy"] = Source("", True)
    sources[f"{PACKAGE}.ops.a"] = Source("", True)
    sources[f"{PACKAGE}.ops.b"] = Source("", True)
    assert check(sources) == []


def _problems(**changes: str) -> list[str]:
    sources = _synthetic(**{**GOOD, **changes})
    for pkg in ("deploy", "ops.a", "ops.b"):
        sources[f"{PACKAGE}.{pkg}"] = Source("", True)
    return check(sources)


def test_ops_importing_vllm_fails():
    problems = _problems(ops__b__k="def f():\n    import vllm.platforms\n")
    assert problems == ["deepinfer_sm80.ops.b.k:2 imports vllm.platforms"]


def test_runtime_importing_tools_fails():
    problems = _problems(arch="from tools.tiers import import_or_skip\n")
    assert problems == [
        "deepinfer_sm80.arch:1 imports tools.tiers (not part of the installed package)"
    ]


def test_runtime_importing_a_testing_package_fails():
    problems = _problems(ops__a__k="from deepinfer_sm80.testing.ampere_fit import KernelSpec\n")
    assert problems == [
        "deepinfer_sm80.ops.a.k:1 imports deepinfer_sm80.testing.ampere_fit (not part of the "
        "installed package)"
    ]


def test_deploy_reaching_torch_through_the_package_fails():
    # deploy.plan -> arch (module level) -> torch: deploy loads torch without naming it.
    problems = _problems(arch="import torch\n")
    assert problems == [
        "deepinfer_sm80.deploy.cli loads torch: deepinfer_sm80.deploy.cli -> "
        "deepinfer_sm80.deploy.plan -> deepinfer_sm80.arch -> torch (line 1)",
        "deepinfer_sm80.deploy.plan loads torch: deepinfer_sm80.deploy.plan -> "
        "deepinfer_sm80.arch -> torch (line 1)",
    ]


def test_deploy_reaching_torch_through_a_package_init_fails():
    sources = _synthetic(**GOOD)
    sources[f"{PACKAGE}.deploy"] = Source("import vllm\n", True)
    sources[f"{PACKAGE}.ops.a"] = Source("", True)
    sources[f"{PACKAGE}.ops.b"] = Source("", True)
    problems = check(sources)
    assert "deepinfer_sm80.deploy.plan loads vllm: deepinfer_sm80.deploy.plan -> " in "".join(
        problems
    )
    assert len(problems) == 3  # deploy, deploy.cli and deploy.plan each load it


def test_deploy_lazy_import_not_listed_fails():
    problems = _problems(deploy__plan="def f():\n    import torch\n")
    assert problems == [
        "deepinfer_sm80.deploy.plan:2 imports torch inside a function; add it to "
        "DEPLOY_LAZY_ALLOWED only for an optional feature"
    ]


def test_type_checking_imports_are_left_out():
    problems = _problems(
        ops__b__k="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vllm\n"
    )
    assert problems == []


def test_private_name_across_ops_fails():
    problems = _problems(ops__b__k="from deepinfer_sm80.ops.a.k import _parse_arches\n")
    assert problems == [
        "deepinfer_sm80.ops.b.k:1 imports deepinfer_sm80.ops.a.k._parse_arches, private to "
        "ops/a; make it public in a module both share"
    ]
    # Through the op's package too.
    problems = _problems(ops__b__k="from deepinfer_sm80.ops.a import _parse_arches\n")
    assert problems == [
        "deepinfer_sm80.ops.b.k:1 imports deepinfer_sm80.ops.a._parse_arches, private to "
        "ops/a; make it public in a module both share"
    ]
    # A private name inside its own op folder is fine.
    assert _problems(ops__a__k="from deepinfer_sm80.ops.a.ref import _rows\n") == []


def test_private_module_across_ops_fails():
    sources = _synthetic(**GOOD, ops__a___impl="x = 1\n")
    sources[f"{PACKAGE}.ops.b.k"] = Source("from deepinfer_sm80.ops.a import _impl\n", False)
    for pkg in ("deploy", "ops.a", "ops.b"):
        sources[f"{PACKAGE}.{pkg}"] = Source("", True)
    assert check(sources) == [
        "deepinfer_sm80.ops.b.k:1 imports deepinfer_sm80.ops.a._impl, private to ops/a; "
        "make it public in a module both share"
    ]


def test_deploy_step_importing_a_later_one_fails():
    # No cycle here (GOOD's cli imports neither): the order rule alone catches it.
    problems = _problems(
        deploy__planner="def f():\n    from deepinfer_sm80.deploy.cli import main\n",
        deploy__launcher="from deepinfer_sm80.deploy import topology\n",
        deploy__topology="from deepinfer_sm80.deploy.planner import plan\n",
    )
    assert problems == [
        "deepinfer_sm80.deploy.planner:2 imports deepinfer_sm80.deploy.cli, a later step "
        "of the deploy flow (planner -> topology -> launcher -> cli)"
    ]
    # The same modules importing forwards only pass.
    forwards = _problems(
        deploy__planner="x = 1\n",
        deploy__launcher="from deepinfer_sm80.deploy import topology\n",
        deploy__topology="from deepinfer_sm80.deploy.planner import plan\n",
    )
    assert forwards == []


def test_cycle_through_a_function_level_import_fails():
    problems = _problems(
        ops__a__ref="def f():\n    from deepinfer_sm80.ops.a import k\n",
    )
    assert problems == ["import cycle: deepinfer_sm80.ops.a.k -> deepinfer_sm80.ops.a.ref"]
