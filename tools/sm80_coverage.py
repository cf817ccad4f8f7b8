"""Which Triton kernels and custom ops DeepSeek-V4.1 runs on SM80, derived from the code.

The rule is a static walk over the installed sources; nothing from vLLM is imported.

1. **Sources.** Modules of ``vllm`` and ``deepinfer_sm80`` are parsed with ``ast``. Code
   that is dead on CUDA sm_80 *and* sm_86 is skipped wherever it appears: the branch of an
   ``if``/conditional expression whose test is ``TYPE_CHECKING``,
   ``current_platform.is_rocm()/is_xpu()/is_cpu()/is_tpu()``, ``rocm_aiter_ops.is_*()``,
   a capability test with a literal (``is_device_capability(90)``,
   ``has_device_capability(90)``, ``is_device_capability_family(100)``), a probe false on
   sm8x by its own definition (``support_deep_gemm``, ``is_arch_support_pdl``,
   ``is_deep_gemm_supported``) or ``not``/``and``/``or`` of these; and the entries of a
   dict keyed ``PlatformEnum.ROCM/XPU/CPU/TPU``. Any other condition keeps both
   branches: the walk over-approximates, and the allowlist (7) records the decisions it
   cannot evaluate.
2. **Graph.** A node is a module-level function or assignment, a class's shell
   (decorators, nested classes, statements), one member of a module-level class (a
   method or a class attribute, also one set later as ``Class.attr = value``), or a
   module's body. A node points to what its code names: globals and imported names
   (also imports inside functions), ``module.attr`` chains, ``Class.member``,
   ``super().member``, a string that is the dotted path of a definition (backends are
   chosen by qualified name; an enum member holding such a string leads to it only when
   named, not when compared, and strings in module-level registry tables are not
   followed), ``torch.ops.<ns>.<op>`` to the Python function registered as that op with
   ``direct_register_custom_op`` (registering alone runs nothing), and a class's bases
   (inheritance only: see 3). Names are chased through re-exports to the defining
   module. Annotations, the class argument of ``isinstance``/``issubclass`` and classes
   compared with ``is``/``==``/``in`` are not uses. Naming a definition runs its module's
   body, which runs the bodies of the modules it imports.
3. **Classes.** A class is *used* when named other than as a base. For a used class, each
   member name of its MRO resolves to one implementation, which runs when the name is
   dunder or ``forward``, when its class is defined by V4.1 (vLLM calls V4.1's layers,
   backends and builders through hooks outside the walk), or when some live code, or the
   code that drives models (``RUNTIME_PACKAGES``), names an attribute of that name: the
   receiver's type is unknown statically, so ``x.m`` may be any member ``m``. A class only
   inherited from runs only what its used subclasses resolve to it.
4. **Roots.** What vLLM's registries load for the model: ``DeepseekV41ForCausalLM``,
   ``DSparkDeepseekV4ForCausalLM`` (the DSpark drafter), ``DeepseekV4FP8Config`` and the
   ``vllm.models.deepseek_v41`` package body (``ROOTS``).
5. **On the path** = reachable from the roots. A *kernel* is a function decorated with
   ``triton.jit`` (bare or with arguments, under ``triton.autotune``/``heuristics``),
   ``gluon.jit``, ``cute.kernel`` or TileLang's JIT, at module level, as a class member
   (the ``kernel`` static method of ``VllmJitKernel``/``VllmTritonJitKernel`` owners) or
   nested in a function; it is on the path when its node is. A Triton function that live
   code only calls from Triton functions and never launches (``k[grid](...)``) is a
   *device helper*, compiled inside its callers. A custom op is on the path when a live
   node names ``torch.ops.<ns>.<op>`` (directly, through an alias such as
   ``ops = torch.ops._C``, as ``getattr(torch.ops.<ns>, "op")``, or by calling a handle
   a facade module looked up at run time, ``OP_FACADES``).
6. **After the plugin's rebinding.** The walk is repeated with the patch ledger: a name
   ``N`` looked up in module ``M`` -- a global of ``M``, or ``M.N`` through the module
   object -- whose ``"M:N"`` is a ledger target resolves to our replacement instead,
   walked the same way; a target naming a kernel removes that kernel. A vLLM kernel or op
   is **replaced by the plugin** when it is on the path without the ledger and off it
   with the ledger: every chain of callers that reached it passes through a rebound name.
   Only the binding where the lookup happens counts: ``from P import N`` copies ``P.N``
   at import, so each module that binds the name must be a ledger target.
7. **Exclusions.** The committed allowlist (``configs/sm80_coverage_allowlist.yaml``),
   each entry with a reason category: ``cut`` stops the walk at a module or definition
   (optionally walking what that code selects on SM8x in its place), ``base_only``
   treats a class the plugin swaps for a subclass as inherited only, ``kernel`` and
   ``op`` entries leave those items unchecked. An entry that no longer matches anything
   on the path is stale.

What remains must fit Ampere (``sm80_coverage_proof``): each Triton kernel compiles for
sm_80 and sm_86 at the configs it is launched with, each library op has sm_80/sm_86 code.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import importlib.util
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

V41_PACKAGE = "vllm.models.deepseek_v41"
# What vLLM's registries load for DeepSeek-V4.1: the architecture and the DSpark draft
# architecture (model_executor/models/registry.py) and the quantization config that
# quant_method "fp8" resolves to for this model type (deepseek_v4_fp8).
ROOTS = (
    V41_PACKAGE,
    f"{V41_PACKAGE}:DeepseekV41ForCausalLM",
    f"{V41_PACKAGE}:DSparkDeepseekV4ForCausalLM",
    f"{V41_PACKAGE}:DeepseekV4FP8Config",
)
# Code that calls the model, its layers and its attention backends by method name
# without being part of the walk: every attribute name used here may be such a call.
RUNTIME_PACKAGES = (
    "vllm.v1.worker",
    "vllm.v1.spec_decode",
    "vllm.model_executor.model_loader",
    "vllm.v1.attention.backend",
    "vllm.v1.attention.backends.utils",
    "vllm.v1.core",
    "vllm.forward_context",
)
WALKED_PACKAGES = ("vllm", "deepinfer_sm80")

_FALSE_ON_CUDA = frozenset(
    {"is_rocm", "is_xpu", "is_cpu", "is_tpu", "is_out_of_tree", "is_zen_cpu", "is_unspecified"}
)
_TRUE_ON_CUDA = frozenset({"is_cuda", "is_cuda_alike"})
# Capability probes that are false on sm_80 and sm_86 by their own definition:
# `current_platform.<probe>()` methods and free functions.
_FALSE_ON_SM8X_METHODS = frozenset({"support_deep_gemm", "is_arch_support_pdl"})
_FALSE_ON_SM8X_FUNCTIONS = frozenset({"is_deep_gemm_supported", "is_deep_gemm_e8m0_used"})
# Members of vLLM's PlatformEnum other than CUDA: dict entries under these keys are dead.
_OTHER_PLATFORMS = frozenset({"ROCM", "XPU", "CPU", "TPU", "OOT", "UNSPECIFIED"})
_AMPERE_CCS = (80, 86)
# Methods a framework outside the walked packages calls by name (torch's nn.Module).
_IMPLICIT_METHODS = frozenset({"forward"})
_QUALNAME = re.compile(r"^(vllm|deepinfer_sm80)(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$")
_REGISTRATION_CALL = "direct_register_custom_op"
# Modules that reach a library's ops through names looked up at run time
# (`_impl = getattr(_dg, "op")` in a lazy init): module -> op namespace.
OP_FACADES = {"vllm.utils.deep_gemm": "deep_gemm"}


# ---------------------------------------------------------------------------------------
# What the walk finds


@dataclass(frozen=True, order=True)
class Symbol:
    """A graph node: ``name`` is a top-level name, ``Class.method``, or "" (module body)."""

    module: str
    name: str = ""

    def __str__(self) -> str:
        return f"{self.module}:{self.name}" if self.name else f"{self.module} (module body)"


@dataclass(frozen=True)
class Param:
    name: str
    annotation: str | None  # source text, e.g. "tl.constexpr"
    default: str | None

    @property
    def is_constexpr(self) -> bool:
        return self.annotation is not None and self.annotation.endswith("constexpr")


@dataclass(frozen=True)
class KernelSite:
    """A JIT-compiled GPU function found in the source."""

    id: str  # "module:qualname", usable as ampere_fit's KernelSpec.kernel
    kind: str  # triton | gluon | cute | tilelang
    owner: Symbol  # the graph node whose liveness is the kernel's
    path: str  # file, as "vllm/..." or "deepinfer_sm80/..."
    lineno: int
    decorators: tuple[str, ...]
    params: tuple[Param, ...]
    returns_value: bool

    @property
    def module(self) -> str:
        return self.id.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.id.partition(":")[2]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"

    @property
    def autotuned(self) -> bool:
        return any(d.split("(")[0].endswith(("autotune", "heuristics")) for d in self.decorators)

    @property
    def is_ours(self) -> bool:
        return self.module.startswith("deepinfer_sm80")


@dataclass(frozen=True)
class OpUse:
    """One place a ``torch.ops`` custom op is named."""

    namespace: str
    op: str
    site: Symbol
    lineno: int

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.op}"


# ---------------------------------------------------------------------------------------
# Platform tests


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    """``a.b.c`` -> ("a", "b", "c"); None if the root is not a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return None


def _capability_arg(call: ast.Call) -> int | None:
    """The capability literal of ``is_device_capability(90)`` or ``(9, 0)``."""
    if not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
        return arg.value
    if isinstance(arg, ast.Tuple) and len(arg.elts) == 2:
        vals = [e.value for e in arg.elts if isinstance(e, ast.Constant)]
        if len(vals) == 2 and all(isinstance(v, int) for v in vals):
            return vals[0] * 10 + vals[1]
    return None


def platform_truth(test: ast.AST) -> bool | None:
    """A platform test's value on CUDA sm_80 and sm_86 (None: unknown, or they differ)."""
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.Attribute) and _chain(test) == ("typing", "TYPE_CHECKING"):
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = platform_truth(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [platform_truth(v) for v in test.values]
        if isinstance(test.op, ast.And):
            if False in values:
                return False
            return True if all(v is True for v in values) else None
        if True in values:
            return True
        return False if all(v is False for v in values) else None
    if isinstance(test, ast.Call) and _chain(test.func) in {(f,) for f in _FALSE_ON_SM8X_FUNCTIONS}:
        return False
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute):
        owner = _chain(test.func.value)
        method = test.func.attr
        if owner and owner[-1] == "rocm_aiter_ops" and method.startswith("is_"):
            return False
        if not owner or owner[-1] != "current_platform":
            return None
        if method in _FALSE_ON_CUDA or method in _FALSE_ON_SM8X_METHODS:
            return False
        if method in _TRUE_ON_CUDA:
            return True
        cc = _capability_arg(test)
        if cc is None:
            return None
        if method == "is_device_capability":
            results = {cc == x for x in _AMPERE_CCS}
        elif method == "has_device_capability":
            results = {x >= cc for x in _AMPERE_CCS}
        elif method == "is_device_capability_family":
            results = {cc // 10 == x // 10 for x in _AMPERE_CCS}
        else:
            return None
        return results.pop() if len(results) == 1 else None
    return None


def _live_statements(stmts: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run on CUDA sm8x: dead platform branches dropped, ``if``/``try``/
    ``with`` blocks flattened."""
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            truth = platform_truth(stmt.test)
            if truth is not False:
                yield from _live_statements(stmt.body)
            if truth is not True:
                yield from _live_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _live_statements(stmt.body)
            for handler in stmt.handlers:
                yield from _live_statements(handler.body)
            yield from _live_statements(stmt.orelse)
            yield from _live_statements(stmt.finalbody)
        elif isinstance(stmt, ast.With):
            yield from _live_statements(stmt.body)
        else:
            yield stmt


# ---------------------------------------------------------------------------------------
# Sources


def package_root(package: str) -> Path:
    """Directory of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


# What a name in a module's namespace stands for.
@dataclass(frozen=True)
class ModuleRef:
    module: str


@dataclass(frozen=True)
class NameRef:
    module: str  # a walked module
    name: str


@dataclass(frozen=True)
class External:
    dotted: str  # outside the walked packages, e.g. "torch", "triton.language"


@dataclass(frozen=True)
class OpsNamespace:
    namespace: str  # an alias of torch.ops.<namespace>


Binding = ModuleRef | NameRef | External | OpsNamespace


class SourceIndex:
    """Dotted module names of the walked packages -> files, each parsed once."""

    def __init__(self, packages: Iterable[str] = WALKED_PACKAGES) -> None:
        self.roots = {p: package_root(p) for p in packages}
        self._infos: dict[str, ModuleInfo | None] = {}
        self._files: dict[str, tuple[Path, bool] | None] = {}
        self._op_registry: dict[str, Symbol] | None = None
        self._runtime_attributes: set[str] | None = None

    def file_of(self, module: str) -> tuple[Path, bool] | None:
        if module not in self._files:
            self._files[module] = self._locate(module)
        return self._files[module]

    def _locate(self, module: str) -> tuple[Path, bool] | None:
        top, _, rest = module.partition(".")
        root = self.roots.get(top)
        if root is None:
            return None
        base = root.joinpath(*rest.split(".")) if rest else root
        py = base.with_suffix(".py")
        if py.is_file():
            return py, False
        if base.is_dir():
            init = base / "__init__.py"
            return (init if init.exists() else base), True
        return None

    def exists(self, module: str) -> bool:
        return self.file_of(module) is not None

    def relpath(self, path: Path) -> str:
        for top, root in self.roots.items():
            if path.is_relative_to(root):
                return str(Path(top) / path.relative_to(root))
        return str(path)

    def info(self, module: str) -> ModuleInfo | None:
        if module not in self._infos:
            located = self.file_of(module)
            # Parsing thousands of files with the collector on costs ~10x: nothing here
            # makes reference cycles worth collecting.
            enabled = gc.isenabled()
            gc.disable()
            try:
                self._infos[module] = (
                    None if located is None else ModuleInfo(self, module, *located)
                )
            finally:
                if enabled:
                    gc.enable()
        return self._infos[module]

    def all_modules(self, package: str) -> Iterator[str]:
        root = self.roots[package]
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            if all(p.isidentifier() for p in parts):
                yield ".".join(parts)

    def runtime_attributes(self) -> set[str]:
        """Attribute names used by the code that drives the model (``RUNTIME_PACKAGES``)."""
        if self._runtime_attributes is None:
            names: set[str] = set()
            for package in RUNTIME_PACKAGES:
                modules = [package] if self.exists(package) else []
                if self.exists(package) and self.file_of(package)[1]:  # a package
                    modules = [m for m in self.all_modules("vllm") if m.startswith(package)]
                for module in modules:
                    located = self.file_of(module)
                    if located is None or not located[0].is_file():
                        continue
                    tree = ast.parse(located[0].read_bytes())
                    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            self._runtime_attributes = names
        return self._runtime_attributes

    def op_registry(self) -> dict[str, Symbol]:
        """Every op registered from Python with direct_register_custom_op, by op name."""
        if self._op_registry is None:
            registry: dict[str, Symbol] = {}
            for package in self.roots:
                for module in self.all_modules(package):
                    located = self.file_of(module)
                    if located is None or not located[0].is_file():
                        continue
                    if _REGISTRATION_CALL.encode() not in located[0].read_bytes():
                        continue
                    info = self.info(module)
                    assert info is not None
                    for op, fn in info.op_registrations.items():
                        registry.setdefault(op, Symbol(module, fn))
            self._op_registry = registry
        return self._op_registry


def _kernel_kind(decorators: list[ast.expr]) -> str | None:
    for dec in decorators:
        target = dec.func if isinstance(dec, ast.Call) else dec
        chain = _chain(target) or ()
        tail = chain[-2:]
        if tail in (("triton", "jit"), ("tl", "jit")):
            return "triton"
        if tail == ("gluon", "jit"):
            return "gluon"
        if tail == ("cute", "kernel"):
            return "cute"
        if chain == ("tilelang_jit",) or tail in (("tilelang", "jit"), ("T", "prim_func")):
            return "tilelang"
    return None


def _returns_value(fn: ast.FunctionDef) -> bool:
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _params(fn: ast.FunctionDef) -> tuple[Param, ...]:
    def param(a: ast.arg, d: ast.expr | None) -> Param:
        return Param(
            a.arg,
            ast.unparse(a.annotation) if a.annotation else None,
            ast.unparse(d) if d is not None else None,
        )

    args = fn.args.posonlyargs + fn.args.args
    defaults: list[ast.expr | None] = [None] * (len(args) - len(fn.args.defaults))
    defaults += list(fn.args.defaults)
    out = [param(a, d) for a, d in zip(args, defaults, strict=True)]
    out += [param(a, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)]
    return tuple(out)


def _registration(call: ast.Call) -> tuple[str, str] | None:
    """(op name, function name) of ``direct_register_custom_op(op_name=..., op_func=f)``."""
    chain = _chain(call.func) or ()
    if not chain or chain[-1] != _REGISTRATION_CALL:
        return None
    kwargs = {k.arg: k.value for k in call.keywords if k.arg}
    op_name = kwargs.get("op_name", call.args[0] if call.args else None)
    op_func = kwargs.get("op_func", call.args[1] if len(call.args) > 1 else None)
    if isinstance(op_name, ast.Constant) and isinstance(op_func, ast.Name):
        return str(op_name.value), op_func.id
    return None


def _is_registry_table(value: ast.AST | None) -> bool:
    """A container literal holding several qualified names (a registry, not a use)."""
    if not isinstance(value, ast.Dict | ast.List | ast.Tuple | ast.Set):
        return False
    strings = [
        n for n in ast.walk(value) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    return sum(1 for n in strings if _QUALNAME.match(n.value)) >= 2


class ModuleInfo:
    """One parsed module: bindings, nodes, kernels and op registrations."""

    def __init__(self, index: SourceIndex, name: str, path: Path, is_package: bool) -> None:
        self.index = index
        self.name = name
        self.path = path
        self.package = name if is_package else name.rpartition(".")[0]
        source = path.read_bytes() if path.is_file() else b""
        self.source_sha = hashlib.sha256(source).hexdigest()
        tree = ast.parse(source, filename=str(path))
        self.bindings: dict[str, Binding] = {}
        self.nodes: dict[str, list[ast.AST]] = defaultdict(list)  # node name -> code
        self.classes: dict[str, list[tuple[str, ...]]] = {}  # class -> base chains
        self.methods: dict[str, list[str]] = defaultdict(list)  # class -> member names
        self.members: dict[str, dict[str, str]] = defaultdict(dict)  # class -> attr -> qualname
        self.registries: set[str] = set()  # assignments that are registry tables
        self.body: list[ast.AST] = []
        self.imported_modules: set[str] = set()
        self.op_registrations: dict[str, str] = {}
        self.kernels: list[KernelSite] = []
        if _REGISTRATION_CALL.encode() in source:
            for call in ast.walk(tree):
                if isinstance(call, ast.Call):
                    reg = _registration(call)
                    if reg is not None:
                        self.op_registrations.setdefault(*reg)
        for stmt in _live_statements(tree.body):
            self._add_statement(stmt)
        self._find_kernels(tree)
        # global -> op it holds, for OP_FACADES modules
        self.facade_ops: dict[str, str] = {}
        if name in OP_FACADES:
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Call)
                    and _chain(node.value.func) == ("getattr",)
                    and len(node.value.args) >= 2
                    and isinstance(node.value.args[1], ast.Constant)
                ):
                    self.facade_ops[node.targets[0].id] = str(node.value.args[1].value)

    @property
    def defs(self) -> set[str]:
        return {n for n in self.nodes if "." not in n}

    def _add_statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            bindings, modules = self.import_bindings(stmt)
            self.bindings.update(bindings)
            self.imported_modules |= modules
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.nodes[stmt.name].append(stmt)
            self.body.extend(stmt.decorator_list)
        elif isinstance(stmt, ast.ClassDef):
            self._add_class(stmt)
        elif self._class_attribute_assignment(stmt):
            # `Config.MethodCls = Impl` fills in a class attribute: it runs like one
            target = stmt.targets[0]  # type: ignore[union-attr]
            self.methods[target.value.id].append(target.attr)
            self.nodes[f"{target.value.id}.{target.attr}"].append(stmt.value)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign) and self._assign_names(stmt):
            ops_ns = self._ops_namespace(stmt.value) if stmt.value is not None else None
            for target in self._assign_names(stmt):
                if ops_ns is not None:
                    self.bindings[target] = OpsNamespace(ops_ns)
                if _is_registry_table(stmt.value):
                    self.registries.add(target)
                self.nodes[target].append(stmt)
        else:
            self.body.append(stmt)

    def _class_attribute_assignment(self, stmt: ast.stmt) -> bool:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return False
        target = stmt.targets[0]
        return (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in self.classes
        )

    def _add_class(self, cls: ast.ClassDef) -> None:
        # decorators run at import (registrations); bases are inheritance edges
        self.body.extend(cls.decorator_list)
        self.classes[cls.name] = [c for c in map(_chain, cls.bases) if c is not None]
        shell: list[ast.AST] = [*cls.decorator_list, *(k.value for k in cls.keywords)]
        for stmt in _live_statements(cls.body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self.methods[cls.name].append(stmt.name)
                self.nodes[f"{cls.name}.{stmt.name}"].append(stmt)
                shell.extend(stmt.decorator_list)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                text = self._qualname_value(stmt.value)
                for target in self._assign_names(stmt):
                    if text is not None:  # an enum member naming a backend
                        self.members[cls.name][target] = text
                    elif stmt.value is not None:  # a class attribute, resolved like a method
                        self.methods[cls.name].append(target)
                        self.nodes[f"{cls.name}.{target}"].append(stmt.value)
            else:
                shell.append(stmt)
        self.nodes[cls.name].append(ast.Module(body=shell, type_ignores=[]))  # type: ignore[arg-type]

    @staticmethod
    def _qualname_value(value: ast.AST | None) -> str | None:
        """The qualified-name string of ``X = "vllm.a.B"`` (or a parenthesised one)."""
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value if _QUALNAME.match(value.value) else None
        return None

    @staticmethod
    def _assign_names(stmt: ast.Assign | ast.AnnAssign) -> list[str]:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = []
        for t in targets:
            elts = t.elts if isinstance(t, ast.Tuple | ast.List) else [t]
            names.extend(e.id for e in elts if isinstance(e, ast.Name))
        return names

    @staticmethod
    def _ops_namespace(value: ast.AST) -> str | None:
        chain = _chain(value)
        if chain and len(chain) == 3 and chain[:2] == ("torch", "ops"):
            return chain[2]
        return None

    def absolute(self, stmt: ast.ImportFrom) -> str:
        if not stmt.level:
            return stmt.module or ""
        base = self.package.split(".")
        if stmt.level > 1:
            base = base[: len(base) - (stmt.level - 1)]
        return ".".join(base + ([stmt.module] if stmt.module else []))

    def import_bindings(
        self, stmt: ast.Import | ast.ImportFrom
    ) -> tuple[dict[str, Binding], set[str]]:
        """The names an import binds, and the walked modules whose bodies it runs."""
        out: dict[str, Binding] = {}
        modules: set[str] = set()
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                target = alias.name if alias.asname else alias.name.partition(".")[0]
                local = alias.asname or target
                if self.index.exists(alias.name):
                    out[local] = ModuleRef(target)
                    modules.add(alias.name)
                else:
                    out[local] = External(target)
            return out, modules
        base = self.absolute(stmt)
        walked = self.index.exists(base)
        for alias in stmt.names:
            if alias.name == "*":
                continue
            local = alias.asname or alias.name
            sub = f"{base}.{alias.name}"
            if walked and self.index.exists(sub):
                out[local] = ModuleRef(sub)
                modules.add(sub)
            elif walked:
                out[local] = NameRef(base, alias.name)
                modules.add(base)
            else:
                out[local] = External(sub)
        return out, modules

    def _find_kernels(self, tree: ast.Module) -> None:
        def visit(body: Iterable[ast.stmt], owner: str | None, qual: tuple[str, ...]) -> None:
            for stmt in body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = (*qual, stmt.name)
                    if owner is not None:
                        node_owner = owner
                    elif len(name) == 2 and qual[0] in self.classes:
                        node_owner = ".".join(name)  # a method of a module-level class
                    else:
                        node_owner = None
                    if isinstance(stmt, ast.FunctionDef):
                        kind = _kernel_kind(stmt.decorator_list)
                        if kind is not None:
                            self.kernels.append(
                                KernelSite(
                                    id=f"{self.name}:{'.'.join(name)}",
                                    kind=kind,
                                    owner=Symbol(self.name, node_owner or stmt.name),
                                    path=self.index.relpath(self.path),
                                    lineno=stmt.lineno,
                                    decorators=tuple(ast.unparse(d) for d in stmt.decorator_list),
                                    params=_params(stmt),
                                    returns_value=_returns_value(stmt),
                                )
                            )
                        visit(stmt.body, node_owner or stmt.name, (*name, "<locals>"))
                    else:
                        visit(_live_statements(stmt.body), node_owner, name)
                elif isinstance(stmt, ast.If | ast.Try | ast.With):
                    for block in ("body", "orelse", "finalbody"):
                        visit(getattr(stmt, block, []), owner, qual)
                    for handler in getattr(stmt, "handlers", []):
                        visit(handler.body, owner, qual)

        visit(_live_statements(tree.body), None, ())


# ---------------------------------------------------------------------------------------
# References out of one node


@dataclass
class _Refs:
    chains: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    compared: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    launched: set[tuple[str, ...]] = field(default_factory=set)
    strings: list[str] = field(default_factory=list)
    local_bindings: dict[str, Binding] = field(default_factory=dict)
    imported: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)
    super_attrs: set[str] = field(default_factory=set)
    called: set[str] = field(default_factory=set)


class _RefCollector(ast.NodeVisitor):
    """The names a piece of code uses, skipping branches that are dead on CUDA sm8x."""

    def __init__(self, info: ModuleInfo, follow_strings: bool) -> None:
        self.info = info
        self.follow_strings = follow_strings
        self.refs = _Refs()
        self._comparing = 0

    def visit_If(self, node: ast.If) -> None:
        truth = platform_truth(node.test)
        if truth is None:
            self.visit(node.test)
        if truth is not False:
            for s in node.body:
                self.visit(s)
        if truth is not True:
            for s in node.orelse:
                self.visit(s)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        truth = platform_truth(node.test)
        if truth is None:
            self.visit(node.test)
        if truth is not False:
            self.visit(node.body)
        if truth is not True:
            self.visit(node.orelse)

    def visit_Import(self, node: ast.Import) -> None:
        self._import(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._import(node)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        bindings, modules = self.info.import_bindings(node)
        self.refs.local_bindings.update(bindings)
        self.refs.imported |= modules

    # annotations are not uses
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        for d in [*node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                self.visit(d)
        for s in node.body:
            self.visit(s)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Dict(self, node: ast.Dict) -> None:
        # {PlatformEnum.CUDA: [...], PlatformEnum.ROCM: [...]}: only CUDA's entry runs
        for key, value in zip(node.keys, node.values, strict=True):
            chain = _chain(key) if key is not None else None
            if (
                chain
                and len(chain) >= 2
                and chain[-2:-1] == ("PlatformEnum",)
                and (chain[-1] in _OTHER_PLATFORMS)
            ):
                continue
            if key is not None:
                self.visit(key)
            self.visit(value)

    def visit_Compare(self, node: ast.Compare) -> None:
        # `backend is AttentionBackendEnum.X` inspects a member; it does not load X's class
        self._comparing += 1
        try:
            self.generic_visit(node)
        finally:
            self._comparing -= 1

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.refs.chains.append(((node.id,), node.lineno))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.refs.attributes.add(node.attr)
        value = node.value
        if isinstance(value, ast.Call) and _chain(value.func) == ("super",):
            self.refs.super_attrs.add(node.attr)
        chain = _chain(node)
        if chain is None:
            self.generic_visit(node)
        elif isinstance(node.ctx, ast.Load):
            if self._comparing:
                self.refs.compared.append((chain, node.lineno))
            else:
                self.refs.chains.append((chain, node.lineno))
            self.refs.attributes.update(chain[1:])

    def visit_Subscript(self, node: ast.Subscript) -> None:
        chain = _chain(node.value)
        if chain is not None:
            self.refs.launched.add(chain)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = _chain(node.func)
        if func is not None and len(func) == 1:
            self.refs.called.add(func[0])
        if func in (("isinstance",), ("issubclass",)) and len(node.args) == 2:
            self.visit(node.args[0])
            return
        if func and func[-1] == _REGISTRATION_CALL:
            # registering runs nothing; torch.ops.<lib>.<op> leads to the function
            skip = {"op_func", "fake_impl"}
            for i, arg in enumerate(node.args):
                if i != 1:
                    self.visit(arg)
            for k in node.keywords:
                if k.arg not in skip:
                    self.visit(k.value)
            return
        if (
            func in (("getattr",), ("hasattr",))
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self.refs.attributes.add(node.args[1].value)
            owner = _chain(node.args[0])
            if owner is not None and func == ("getattr",):
                self.refs.chains.append(((*owner, node.args[1].value), node.lineno))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if self.follow_strings and isinstance(node.value, str) and _QUALNAME.match(node.value):
            self.refs.strings.append(node.value)


# ---------------------------------------------------------------------------------------
# The walk


@dataclass(frozen=True)
class _Inherit:
    """An edge from a class to one of its bases (the base's members do not run by it)."""

    base: Symbol


class Walk:
    """Reachability from the V4.1 roots, optionally with the ledger and module cuts.

    Args:
        index: the parsed sources (share one between walks).
        redirects: ledger target "module:attr" -> replacement "module:attr".
        cuts: what the walk does not enter: module prefixes ("vllm.a.b") and
            definitions ("vllm.a.b:Name", with its methods); as a mapping, each cut's
            value names the definitions that code selects on CUDA sm8x, walked in its
            place from the same referrer.
        base_only: classes ("module:Class") treated as only inherited from: their
            members run only through live subclasses that do not override them.
        roots: "module" (its body) or "module:Name" entries; default ``ROOTS``.
    """

    def __init__(
        self,
        index: SourceIndex,
        redirects: dict[str, str] | None = None,
        cuts: Iterable[str] | Mapping[str, Sequence[str]] = (),
        roots: Iterable[str] = ROOTS,
        base_only: Iterable[str] = (),
    ) -> None:
        self.index = index
        self.redirects = dict(redirects or {})
        # cut -> what the code it cuts selects on CUDA sm8x (walked instead)
        self.cuts: dict[str, tuple[str, ...]] = (
            {k: tuple(v) for k, v in cuts.items()}
            if isinstance(cuts, Mapping)
            else dict.fromkeys(cuts, ())
        )
        self.base_only = frozenset(base_only)
        self.base_only_hits: dict[str, set[Symbol]] = defaultdict(set)
        self.roots = tuple(roots)
        self.live: set[Symbol] = set()
        self.parents: dict[Symbol, Symbol | None] = {}
        self.launched: set[Symbol] = set()  # nodes named as k[...]
        self.called_from: dict[Symbol, set[Symbol]] = defaultdict(set)
        self.op_uses: list[OpUse] = []
        self.redirected: dict[str, set[Symbol]] = defaultdict(set)  # target -> referrers
        self.cut_hits: dict[str, set[Symbol]] = defaultdict(set)  # cut -> referrers
        self.unresolved: set[tuple[str, str]] = set()
        self.attributes: set[str] = set(_IMPLICIT_METHODS) | index.runtime_attributes()
        self._pending_methods: dict[str, list[tuple[Symbol, Symbol]]] = defaultdict(list)
        self.used_classes: set[Symbol] = set()
        self._bases_cache: dict[Symbol, list[Symbol]] = {}
        self._queue: deque[Symbol] = deque()
        # Millions of AST nodes stay alive: a full collection would rescan them all,
        # many times over, for no cycles worth freeing.
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._run()
        finally:
            if enabled:
                gc.enable()

    # -- graph ---------------------------------------------------------------------------

    def _cut(self, sym: Symbol) -> str | None:
        """The cut entry that stops the walk at ``sym``: a module prefix, or
        "module:Name" for a definition (and its methods)."""
        for cut in self.cuts:
            module, sep, name = cut.partition(":")
            if sep:
                if sym.module == module and (sym.name == name or sym.name.startswith(name + ".")):
                    return cut
            elif sym.module == module or sym.module.startswith(module + "."):
                return cut
        return None

    def _add(self, sym: Symbol, parent: Symbol | None, inherit: bool = False) -> None:
        if parent is not None and sym.name:
            self.called_from[sym].add(parent)
        if sym in self.live:
            if not inherit and sym not in self.used_classes and self._is_class(sym):
                self._use_class(sym)
            return
        cut = self._cut(sym)
        if cut is not None:
            if parent is not None:
                first = cut not in self.cut_hits
                self.cut_hits[cut].add(parent)
                if first:
                    for selected in self.cuts[cut]:
                        module, _, name = selected.partition(":")
                        self._add(Symbol(*self.follow_export(module, name)), parent)
            return
        info = self.index.info(sym.module)
        if info is None or (sym.name and sym.name not in info.nodes):
            return
        self.live.add(sym)
        self.parents[sym] = parent
        self._queue.append(sym)
        if not sym.name:
            if "." in sym.module:  # importing a.b.c runs a.b first
                self._add(Symbol(sym.module.rpartition(".")[0]), sym)
            return
        self._add(Symbol(sym.module), sym)
        cls, _, member = sym.name.partition(".")
        if member:
            self._add(Symbol(sym.module, cls), sym, inherit=True)
        elif not inherit and cls in info.classes:
            self._use_class(sym)

    def _is_class(self, sym: Symbol) -> bool:
        info = self.index.info(sym.module)
        return info is not None and sym.name in info.classes

    def _bases(self, cls: Symbol) -> list[Symbol]:
        """The walked base classes of ``cls``, resolved like any other name."""
        if cls not in self._bases_cache:
            info = self.index.info(cls.module)
            assert info is not None
            bases = []
            for chain in info.classes.get(cls.name, ()):
                # a class statement runs at import, before any rebinding: the base is
                # the unpatched class even where the ledger later rebinds its name
                found = [
                    t
                    for t, _ in self._resolve_chain(info, chain, {}, None, 0, patched=False)
                    if isinstance(t, Symbol) and self._is_class(t)
                ]
                if found:
                    bases.append(found[-1])
            self._bases_cache[cls] = bases
        return self._bases_cache[cls]

    def _mro(self, cls: Symbol) -> list[Symbol]:
        """``cls`` and its walked bases, depth first (C3 differs only on diamonds)."""
        order: list[Symbol] = []
        stack = [cls]
        while stack:
            c = stack.pop(0)
            if c in order or len(order) > 64:
                continue
            order.append(c)
            stack = self._bases(c) + stack
        return order

    def _lookup(self, cls: Symbol, name: str) -> Symbol | None:
        """The member ``name`` of ``cls`` (method or class attribute) through its MRO."""
        for c in self._mro(cls):
            info = self.index.info(c.module)
            if info is not None and name in info.methods.get(c.name, ()):
                return Symbol(c.module, f"{c.name}.{name}")
        return None

    def _use_class(self, cls: Symbol) -> None:
        """A class used other than as a base: each member name it resolves may run."""
        if str(cls) in self.base_only:
            self.base_only_hits[str(cls)].add(self.parents.get(cls) or cls)
            return
        self.used_classes.add(cls)
        names: dict[str, Symbol] = {}
        for c in reversed(self._mro(cls)):
            info = self.index.info(c.module)
            assert info is not None
            for m in info.methods.get(c.name, ()):
                names[m] = Symbol(c.module, f"{c.name}.{m}")
        for m, impl in names.items():
            # vLLM drives the classes V4.1 defines through hooks it names outside the walk
            v41 = impl.module == V41_PACKAGE or impl.module.startswith(V41_PACKAGE + ".")
            if v41 or (m.startswith("__") and m.endswith("__")) or m in self.attributes:
                self._add(impl, cls)
            else:
                self._pending_methods[m].append((impl, cls))

    def _note_attributes(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self.attributes:
                continue
            self.attributes.add(name)
            for msym, parent in self._pending_methods.pop(name, ()):
                self._add(msym, parent)

    def _run(self) -> None:
        for root in self.roots:
            module, _, name = root.partition(":")
            if self.index.info(module) is None:
                raise ModuleNotFoundError(f"root {root!r}: no module {module}")
            self._add(Symbol(*self.follow_export(module, name)) if name else Symbol(module), None)
        while self._queue:
            sym = self._queue.popleft()
            for target, line in self._edges(sym):
                if isinstance(target, _Inherit):
                    self._add(target.base, sym, inherit=True)
                elif isinstance(target, Symbol):
                    self._add(target, sym)
                else:
                    self.op_uses.append(OpUse(target[0], target[1], sym, line))

    def _edges(self, sym: Symbol) -> Iterator[tuple[Symbol | _Inherit | tuple[str, str], int]]:
        info = self.index.info(sym.module)
        assert info is not None
        follow_strings = sym.name not in info.registries
        collector = _RefCollector(info, follow_strings)
        if sym.name:
            for node in info.nodes[sym.name]:
                collector.visit(node)
        else:
            for node in info.body:
                collector.visit(node)
            for module in sorted(info.imported_modules):
                yield Symbol(module), 0
        refs = collector.refs
        self._note_attributes(refs.attributes)
        cls, _, member = sym.name.partition(".")
        if sym.name and not member and cls in info.classes:
            for base in self._bases(sym):
                yield _Inherit(base), 0
        if member and refs.super_attrs:
            for base in self._bases(Symbol(sym.module, cls)):
                for name in refs.super_attrs:
                    impl = self._lookup(base, name)
                    if impl is not None:
                        yield impl, 0
        for module in sorted(refs.imported):
            yield Symbol(module), 0
        for name in sorted(refs.called & info.facade_ops.keys()):
            yield (OP_FACADES[info.name], info.facade_ops[name]), 0
        for chain, line in refs.chains:
            yield from self._resolve_chain(info, chain, refs.local_bindings, sym, line)
        for chain, line in refs.compared:
            # `chosen is SomeClass` inspects the class; it does not make one
            for target, at in self._resolve_chain(
                info, chain, refs.local_bindings, sym, line, follow_members=False
            ):
                is_class = isinstance(target, Symbol) and self._is_class(target)
                yield (_Inherit(target) if is_class else target), at
        for chain in refs.launched:
            for target, _ in self._resolve_chain(info, chain, refs.local_bindings, None, 0):
                if isinstance(target, Symbol):
                    self.launched.add(target)
        for text in refs.strings:
            target = self._resolve_dotted(text)
            if target is not None:
                yield target, 0

    def _resolve_dotted(self, text: str) -> Symbol | None:
        """A "vllm.a.b.C" / "vllm.a.b:C" string -> the node it names."""
        module, sep, attr = text.partition(":")
        if not sep:
            module, _, attr = text.rpartition(".")
        while module:
            info = self.index.info(module)
            if info is not None:
                name = attr.partition(".")[0]
                if name in info.nodes:
                    return Symbol(*self.follow_export(module, name))
                if name in info.bindings:
                    return Symbol(*self.follow_export(module, name))
                if self.index.exists(f"{module}.{name}"):
                    return Symbol(f"{module}.{name}")
                return None
            module, _, head = module.rpartition(".")
            attr = f"{head}.{attr}"
        return None

    def _redirect(self, module: str, name: str, referrer: Symbol | None) -> Symbol | None:
        """Our replacement, when the ledger rebinds ``module:name``."""
        key = f"{module}:{name}"
        replacement = self.redirects.get(key)
        if replacement is None:
            return None
        if referrer is not None:
            self.redirected[key].add(referrer)
        rep_module, _, rep_name = replacement.partition(":")
        return Symbol(*self.follow_export(rep_module, rep_name))

    def follow_export(self, module: str, name: str, depth: int = 0) -> tuple[str, str]:
        """Chase a re-exported name to the module that defines it."""
        info = self.index.info(module)
        if info is None or depth > 20 or name in info.nodes:
            return module, name
        binding = info.bindings.get(name)
        if isinstance(binding, NameRef):
            return self.follow_export(binding.module, binding.name, depth + 1)
        if isinstance(binding, ModuleRef):
            return binding.module, ""
        return module, name

    def _member(
        self, cls: Symbol, rest: list[str], referrer: Symbol | None, patched: bool = True
    ) -> Symbol | str | None:
        """``Class.attr``: the method node, or the qualified name an enum member holds."""
        if not rest:
            return None
        info = self.index.info(cls.module)
        assert info is not None
        attr = rest[0]
        redirected = self._redirect(cls.module, f"{cls.name}.{attr}", referrer) if patched else None
        if redirected is not None:
            return redirected
        impl = self._lookup(cls, attr)
        if impl is not None:
            return impl
        for c in self._mro(cls):
            c_info = self.index.info(c.module)
            if c_info is not None and attr in c_info.members.get(c.name, {}):
                return c_info.members[c.name][attr]
        return None

    def _resolve_chain(
        self,
        info: ModuleInfo,
        chain: tuple[str, ...],
        local: dict[str, Binding],
        referrer: Symbol | None,
        line: int,
        follow_members: bool = True,
        patched: bool = True,
    ) -> Iterator[tuple[Symbol | tuple[str, str], int]]:
        head = chain[0]
        binding: Binding | Symbol
        if head in info.facade_ops:
            return  # an op handle; calling it is the use (see _edges)
        if head in local:
            binding = local[head]
        else:
            redirected = self._redirect(info.name, head, referrer) if patched else None
            if redirected is not None:
                yield redirected, line
                return
            if head in info.bindings:
                binding = info.bindings[head]
            elif head in info.nodes:
                binding = Symbol(info.name, head)
            else:
                return  # builtin, local variable or parameter
        rest = list(chain[1:])
        for _ in range(64):
            if isinstance(binding, Symbol):
                if binding.name and "." not in binding.name:
                    member = self._member(binding, rest, referrer, patched)
                    if isinstance(member, Symbol):
                        yield member, line
                        return
                    if isinstance(member, str):
                        target = self._resolve_dotted(member) if follow_members else None
                        if target is not None:
                            yield target, line
                        return
                yield binding, line
                return
            if isinstance(binding, OpsNamespace):
                if rest:
                    yield from self._op_target(binding.namespace, rest[0], line)
                return
            if isinstance(binding, External):
                parts = [*binding.dotted.split("."), *rest]
                if parts[:2] == ["torch", "ops"] and len(parts) >= 4:
                    yield from self._op_target(parts[2], parts[3], line)
                return
            if isinstance(binding, NameRef):
                target_info = self.index.info(binding.module)
                if target_info is None:
                    return
                if binding.name in target_info.nodes:
                    binding = Symbol(binding.module, binding.name)
                elif binding.name in target_info.bindings:
                    binding = target_info.bindings[binding.name]
                elif self.index.exists(f"{binding.module}.{binding.name}"):
                    binding = ModuleRef(f"{binding.module}.{binding.name}")
                else:
                    self.unresolved.add((binding.module, binding.name))
                    yield Symbol(binding.module), line
                    return
                continue
            # ModuleRef
            yield Symbol(binding.module), line
            if not rest:
                return
            attr = rest.pop(0)
            redirected = self._redirect(binding.module, attr, referrer) if patched else None
            if redirected is not None:
                yield redirected, line
                return
            target_info = self.index.info(binding.module)
            sub = f"{binding.module}.{attr}"
            if target_info is not None and attr in target_info.nodes:
                binding = Symbol(binding.module, attr)
            elif target_info is not None and attr in target_info.bindings:
                binding = target_info.bindings[attr]
            elif self.index.exists(sub):
                binding = ModuleRef(sub)
            else:
                self.unresolved.add((binding.module, attr))
                return

    def _op_target(
        self, namespace: str, op: str, line: int
    ) -> Iterator[tuple[Symbol | tuple[str, str], int]]:
        python_op = self.index.op_registry().get(op)
        if python_op is not None:
            yield python_op, line
        yield (namespace, op), line

    # -- results -------------------------------------------------------------------------

    @cached_property
    def modules(self) -> set[str]:
        """Modules the walk entered (their bodies run)."""
        return {s.module for s in self.live}

    @cached_property
    def kernels(self) -> dict[str, KernelSite]:
        """Every kernel defined in a module the walk entered, live or not."""
        out = {}
        for module in sorted(self.modules):
            info = self.index.info(module)
            assert info is not None
            for k in info.kernels:
                out[k.id] = k
        return out

    @cached_property
    def live_kernels(self) -> dict[str, KernelSite]:
        """Kernels whose node is live, less those a ledger target names directly."""
        return {
            kid: k
            for kid, k in self.kernels.items()
            if k.owner in self.live and kid not in self.redirects
        }

    @cached_property
    def _triton_owners(self) -> set[Symbol]:
        owners = set()
        for module in self.modules:
            info = self.index.info(module)
            assert info is not None
            owners |= {k.owner for k in info.kernels if k.kind == "triton"}
        return owners

    def is_device_helper(self, kernel: KernelSite) -> bool:
        """A module-level Triton function that live code only calls from other Triton
        functions and never launches."""
        if kernel.kind != "triton" or kernel.autotuned or "." in kernel.qualname:
            return False
        if kernel.owner in self.launched:
            return False
        callers = {c for c in self.called_from.get(kernel.owner, ()) if c in self.live}
        if not callers:
            return kernel.returns_value
        return callers <= self._triton_owners

    @cached_property
    def live_ops(self) -> dict[str, list[OpUse]]:
        out: dict[str, list[OpUse]] = defaultdict(list)
        for use in self.op_uses:
            if use.site in self.live:
                out[use.qualified].append(use)
        return dict(out)

    def path_to(self, sym: Symbol) -> list[Symbol]:
        """One chain of references from a root to ``sym`` (for reports)."""
        chain = []
        cur: Symbol | None = sym
        while cur is not None and len(chain) < 60:
            chain.append(cur)
            cur = self.parents.get(cur)
        return list(reversed(chain))


# ---------------------------------------------------------------------------------------
# The committed allowlist

REPO_ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST_PATH = REPO_ROOT / "configs" / "sm80_coverage_allowlist.yaml"
ENTRY_KINDS = ("cut", "base_only", "kernel", "op")
# Categories whose entries must name the package that replaces the code.
NEEDS_HELPER = frozenset({"pending-replacement", "replaced-by-plugin"})


@dataclass(frozen=True)
class AllowEntry:
    kind: str  # cut | base_only | kernel | op
    target: str
    category: str
    reason: str
    select: tuple[str, ...] = ()
    helper: str | None = None


@dataclass(frozen=True)
class Allowlist:
    categories: dict[str, str]
    entries: tuple[AllowEntry, ...]

    def of_kind(self, kind: str) -> list[AllowEntry]:
        return [e for e in self.entries if e.kind == kind]

    @property
    def cuts(self) -> dict[str, tuple[str, ...]]:
        return {e.target: e.select for e in self.of_kind("cut")}

    @property
    def base_only(self) -> list[str]:
        return [e.target for e in self.of_kind("base_only")]

    @property
    def kernels(self) -> dict[str, AllowEntry]:
        return {e.target: e for e in self.of_kind("kernel")}

    @property
    def ops(self) -> dict[str, AllowEntry]:
        return {e.target: e for e in self.of_kind("op")}


class AllowlistError(ValueError):
    """The allowlist file is malformed."""


def load_allowlist(path: Path = ALLOWLIST_PATH) -> Allowlist:
    """Read and check the allowlist: one kind per entry, a known category, a reason,
    a helper where the category needs one, no duplicate targets."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    categories = dict(data.get("categories") or {})
    entries: list[AllowEntry] = []
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(data.get("entries") or []):
        kinds = [k for k in ENTRY_KINDS if k in raw]
        where = f"entry {i} ({raw})"
        if len(kinds) != 1:
            problems.append(f"{where}: needs exactly one of {ENTRY_KINDS}")
            continue
        kind = kinds[0]
        entry = AllowEntry(
            kind=kind,
            target=str(raw[kind]),
            category=str(raw.get("category", "")),
            reason=str(raw.get("reason", "")).strip(),
            select=tuple(raw.get("select") or ()),
            helper=raw.get("helper"),
        )
        if entry.category not in categories:
            problems.append(
                f"{where}: category {entry.category!r} is not one of {sorted(categories)}"
            )
        if not entry.reason:
            problems.append(f"{where}: give a one-line reason")
        if entry.category in NEEDS_HELPER and not entry.helper:
            problems.append(f"{where}: {entry.category} entries name the replacing helper package")
        if entry.select and kind != "cut":
            problems.append(f"{where}: only cut entries take select")
        if (kind, entry.target) in seen:
            problems.append(f"{where}: duplicate {kind} {entry.target}")
        seen.add((kind, entry.target))
        entries.append(entry)
    if problems:
        raise AllowlistError(f"{path}:\n" + "\n".join(problems))
    return Allowlist(categories, tuple(entries))


# ---------------------------------------------------------------------------------------
# The ledger as redirects


def ledger_redirects(index: SourceIndex, ledger: Iterable[object]) -> dict[str, str]:
    """Ledger targets -> replacements, every target written "module:attr" (a dotted
    "a.b.c.attr", as ``register_kernels`` takes, is split at its longest module)."""
    out: dict[str, str] = {}
    for entry in ledger:
        replacement = entry.replacement  # type: ignore[attr-defined]
        for target in entry.targets:  # type: ignore[attr-defined]
            out[normalize_target(index, target)] = replacement
    return out


def normalize_target(index: SourceIndex, target: str) -> str:
    if ":" in target:
        return target
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if index.exists(module):
            return f"{module}:{'.'.join(parts[cut:])}"
    return target


# ---------------------------------------------------------------------------------------
# The coverage: three walks and their differences

# Namespaces of ops registered from Python (their code is walked) or by torch itself.
PYTHON_OP_NAMESPACES = frozenset({"vllm", "vllm_ir", "aten", "prims", "_c10d_functional"})


@dataclass
class Coverage:
    """What the walks found. Kernel and op keys are ids ("module:qualname",
    "namespace::op")."""

    found_kernels: dict[str, KernelSite]  # defined in a module the unpatched walk enters
    found_ops: dict[str, list[OpUse]]  # named by live code of the unpatched walk
    before_ledger: Walk  # allowlist applied, no ledger
    final: Walk  # ledger and allowlist applied
    unpatched: Walk  # neither
    allowlist: Allowlist
    redirects: dict[str, str]

    # -- kernels ---------------------------------------------------------------------

    def is_helper(self, kernel: KernelSite) -> bool:
        return self.final.is_device_helper(kernel)

    @cached_property
    def replaced_kernels(self) -> dict[str, KernelSite]:
        """vLLM kernels the ledger takes off the path."""
        after = self.final.live_kernels
        return {
            k: v
            for k, v in self.before_ledger.live_kernels.items()
            if k not in after and not v.is_ours
        }

    @cached_property
    def kernels_on_path(self) -> dict[str, KernelSite]:
        """Every kernel on the path after the plugin's rebinding (ours and vLLM's),
        allowlisted ones included."""
        return dict(self.final.live_kernels)

    @cached_property
    def allowlisted_kernels(self) -> dict[str, KernelSite]:
        listed = self.allowlist.kernels
        return {k: v for k, v in self.kernels_on_path.items() if k in listed}

    @cached_property
    def kernels_to_check(self) -> dict[str, KernelSite]:
        """Kernels that must compile for sm_80/sm_86: on the path, not allowlisted,
        not device helpers (those compile inside their callers)."""
        listed = self.allowlist.kernels
        return {
            k: v
            for k, v in self.kernels_on_path.items()
            if k not in listed and not self.is_helper(v)
        }

    # -- ops -------------------------------------------------------------------------

    @cached_property
    def ops_on_path(self) -> dict[str, list[OpUse]]:
        return dict(self.final.live_ops)

    @cached_property
    def replaced_ops(self) -> list[str]:
        return sorted(set(self.before_ledger.live_ops) - set(self.final.live_ops))

    @cached_property
    def library_ops_to_check(self) -> dict[str, list[OpUse]]:
        """Library ops on the path, less Python-registered ones and allowlisted ones."""
        listed = self.allowlist.ops
        return {
            op: uses
            for op, uses in self.ops_on_path.items()
            if op.split("::")[0] not in PYTHON_OP_NAMESPACES and op not in listed
        }

    # -- allowlist health --------------------------------------------------------------

    def stale_entries(self) -> list[str]:
        """Entries that no longer match anything on the path, each with why."""
        out = []
        for e in self.allowlist.of_kind("cut"):
            module = e.target.partition(":")[0]
            if not self.final.index.exists(module):
                out.append(f"cut {e.target}: no such module")
            elif e.target not in self.final.cut_hits:
                out.append(f"cut {e.target}: the path no longer reaches it")
            for sel in e.select:
                mod, _, name = sel.partition(":")
                info = self.final.index.info(mod)
                if info is None or (name and name.partition(".")[0] not in info.nodes):
                    out.append(f"cut {e.target}: select {sel} does not exist")
        for e in self.allowlist.of_kind("base_only"):
            if e.target not in self.final.base_only_hits:
                out.append(f"base_only {e.target}: nothing uses the class any more")
        for e in self.allowlist.of_kind("kernel"):
            if e.target not in self.final.live_kernels:
                gone = e.target not in self.found_kernels
                why = (
                    "no such kernel" if gone else "not on the path (the ledger or a cut covers it)"
                )
                out.append(f"kernel {e.target}: {why}")
        for e in self.allowlist.of_kind("op"):
            if e.target not in self.final.live_ops:
                out.append(f"op {e.target}: not on the path")
        return out


def analyze(
    index: SourceIndex | None = None,
    ledger: Iterable[object] | None = None,
    allowlist: Allowlist | None = None,
) -> Coverage:
    """Run the three walks: unpatched, allowlist only, allowlist + ledger."""
    index = index or SourceIndex()
    if ledger is None:
        from deepinfer_sm80.vllm_plugin.ledger import LEDGER as ledger  # noqa: N811
    allowlist = allowlist or load_allowlist()
    redirects = ledger_redirects(index, ledger)
    unpatched = Walk(index)
    # base_only entries record what the ledger's replacements do, so they belong to the
    # patched walk only
    before = Walk(index, cuts=allowlist.cuts)
    final = Walk(index, redirects=redirects, cuts=allowlist.cuts, base_only=allowlist.base_only)
    return Coverage(
        found_kernels=unpatched.kernels,
        found_ops=dict(unpatched.live_ops),
        before_ledger=before,
        final=final,
        unpatched=unpatched,
        allowlist=allowlist,
        redirects=redirects,
    )
