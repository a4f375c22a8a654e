"""Mutation testing of the pure core: ``python -m scripts.mutate [store/hlc.py ...]``.

Theory of operation. A mutant is the module with one small change (a flipped comparison,
``and``/``or`` or ``max``/``min`` swapped, an integer constant or a slice bound shifted by one,
a return value replaced by ``None``, a statement deleted, ...). A test run that fails kills it;
one that passes leaves a survivor: a behaviour no test pins down, dead code, or an equivalent
change (listed with a reason in ``scripts/mutation_equivalents.toml``).

Speed comes from three things, so that the whole core runs in minutes on one niced core:

- One pytest session per module collects the module's test files once. A forked child runs
  them all once with a line tracer on the module (the baseline: must pass; records which tests
  reach which lines and how long each takes).
- A mutant inside a function is compiled from the mutated source, and a forked child swaps the
  new code object into the live function (``func.__code__``), so every ``from m import f``
  elsewhere sees it, and runs only the tests that reached the mutated lines, fastest first,
  stopping at the first failure. A mutant on lines no test reaches survives without a run.
- A mutant in module-level code that changes plain constants (numbers, strings, bytes) or a
  function's defaults runs the mutated module body aside, and the forked child patches the
  changed values into the live module and into every module that imported them by name; it
  runs the tests that reach lines naming them (every test of the module if another module
  imported them). Any other module-level mutant (a class body, a table of objects) is
  imported fresh: a child of this driver process (which never imports the project) runs the
  module's test files with an import hook serving the mutated source.

Children that run past their timeout (three times the baseline of the tests they run, plus a
margin) are killed and counted as timed out; an endless loop is caught, not a bug in tests.
Hypothesis runs derandomized and without its example database, so a run is reproducible and
leaves nothing behind.

The JSON summary (``docs/mutation-results/mutation.json`` by default) keeps one entry per module:
mutants, killed, timed out, survived, equivalent, the score and every survivor with
``file:line``, the function, the mutation and, for an equivalent one, the reason. Running one
module updates only its entry.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import datetime
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import CodeType, FrameType, ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS_FILE = ROOT / "scripts" / "mutation_equivalents.toml"
DEFAULT_OUT = ROOT / "docs" / "mutation-results" / "mutation.json"

_STORE_TESTS = "tests/store/"
_SYNC_TESTS = "tests/sync/"
_DM3_TESTS = "tests/dm3/"

# The fast test files that exercise each module. Within them, only the tests whose baseline
# run reached a mutant's lines run against it, so a generous list costs collection time only.
MODULE_TESTS: dict[str, list[str]] = {
    "store/hlc.py": ["test_hlc.py", "test_merge.py", "test_records.py"],
    "store/keys.py": ["test_keys.py", "test_chatdb.py", "test_fast_codecs.py", "test_retention.py"],
    "store/records.py": [
        "test_records.py",
        "test_fast_codecs.py",
        "test_decode_bignums.py",
        "test_bad_input.py",
        "test_chat_proof.py",
        "test_ops.py",
        "test_reads.py",  # sender_and_kind and kind_of, read in place
    ],
    "store/merge.py": ["test_merge.py", "test_chatdb.py", "test_chatdb_stateful.py"],
    "store/authz.py": [
        "test_authz.py",
        "test_chat_proof.py",
        "test_records.py",
        "test_ops.py",
        "test_bad_input.py",
        "test_chatdb.py",
        "test_authz_convergence.py",
    ],
    "store/retention.py": [
        "test_retention.py",
        "test_chatdb.py",
        "test_chatdb_stateful.py",
        "test_retention_property.py",
    ],
    "store/ops.py": ["test_ops.py", "test_bad_input.py", "test_chatdb.py", "test_chat_proof.py"],
    "store/access.py": [
        "test_access.py",
        "test_chatdb.py",
        "test_chat_proof.py",
        "test_authz_convergence.py",
    ],
    "store/waiting.py": [
        "test_waiting.py",
        "test_chatdb.py",
        "test_chat_proof.py",
        "test_authz_convergence.py",
    ],
    "store/kinds.py": [
        "test_kinds.py",
        "test_kinds_convergence.py",
        "test_views.py",
        "test_erasure.py",
        "test_deletes.py",
        "test_reads.py",
    ],
    "dm3/crypto.py": ["test_crypto.py", "test_envelope.py"],
    "dm3/envelope.py": ["test_envelope.py"],
    "dm3/rpc.py": ["test_rpc_and_names.py"],
    "dm3/names.py": ["test_rpc_and_names.py"],
    "dm3/containers.py": ["test_containers.py"],
    "sync/merkle.py": ["test_merkle.py", "test_replica_agreement.py", "test_loopback.py"],
    "sync/protocol.py": [
        "test_protocol.py",
        "test_session_edges.py",
        "test_session_paths.py",
        "test_loopback.py",
        "test_frame_bignums.py",
        "test_retention_property.py",
        "test_authz_convergence.py",
        "test_claims.py",  # the sessions of one replica at once: claims, pruning, pacing
        "test_sketch_sessions.py",
        "test_checked_listing.py",  # a region's listing against its tree
    ],
    "sync/frames.py": [
        "test_frames.py",
        "test_frame_limits.py",
        "test_frame_bignums.py",
        "test_protocol.py",
        "test_scope_hostile.py",
    ],
}


def test_files(module: str) -> list[str]:
    """The module's test files that exist, as paths relative to the repository."""
    found = []
    for name in MODULE_TESTS[module]:
        for folder in (_STORE_TESTS, _SYNC_TESTS, _DM3_TESTS):
            if (ROOT / folder / name).exists():
                found.append(folder + name)
    return found


# ---------------------------------------------------------------------------- mutations


@dataclass(frozen=True)
class Mutant:
    index: int  # position in the module's deterministic site order: re-parse, re-apply
    line: int
    end_line: int
    function: str | None  # qualname of the outermost def whose body holds it; None: module level
    mutation: str  # "`a < b` -> `a <= b`"
    source: str  # the line as written; with the module and the mutation, the key for equivalents


_COMPARE_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BINOP_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitOr,
}


@dataclass
class _Site:
    node: ast.AST
    parent: Any  # an ast node, or a stand-in holder while describing
    field_name: str | None
    position: int | None  # index in the parent's list field, if any
    function: str | None
    kind: str
    detail: int = 0  # which operator of a chained comparison


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_type_checking(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and ast.unparse(stmt.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def _no_mutate_lines(source: str) -> set[int]:
    return {n for n, text in enumerate(source.splitlines(), 1) if "# pragma: no mutate" in text}


def _sites(tree: ast.Module, skip_lines: set[int]) -> Iterator[_Site]:
    """Every mutation site, in a fixed order (the order is the mutant's identity)."""

    def body(
        node: ast.AST, stmts: list[ast.stmt], scope: list[str], function: str | None
    ) -> Iterator[_Site]:
        for i, stmt in enumerate(stmts):
            if not (i == 0 and _is_docstring(stmt)):
                yield from visit(stmt, node, "body", i, scope, function)

    def visit(
        node: ast.AST,
        parent: ast.AST | None,
        fname: str | None,
        pos: int | None,
        scope: list[str],
        function: str | None,  # the outermost def around it: its code object gets swapped
    ) -> Iterator[_Site]:
        if getattr(node, "lineno", None) in skip_lines:
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # Decorators, annotations and defaults run where the def runs.
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    yield from visit(default, node, None, None, scope, function)
            inner = [*scope, node.name]
            yield from body(node, node.body, inner, function or ".".join(inner))
            return
        if isinstance(node, ast.ClassDef):
            yield from body(node, node.body, [*scope, node.name], function)
            return
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                yield from visit(node.value, node, "value", None, scope, function)
            return
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return
        if isinstance(node, ast.stmt) and _is_type_checking(node):
            return
        yield from _node_sites(node, parent, fname, pos, function)
        for child_field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        yield from visit(child, node, child_field, i, scope, function)
            elif isinstance(value, ast.AST):
                yield from visit(value, node, child_field, None, scope, function)

    yield from body(tree, tree.body, [], None)


def _node_sites(
    node: ast.AST, parent: ast.AST | None, fname: str | None, pos: int | None, function: str | None
) -> Iterator[_Site]:
    def site(kind: str, detail: int = 0) -> _Site:
        return _Site(node, parent, fname, pos, function, kind, detail)

    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARE_FLIP:
                yield site("compare", i)
    elif isinstance(node, ast.BoolOp):
        yield site("boolop")
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        yield site("binop")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield site("unary")
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("max", "min")
    ):
        yield site("maxmin")
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield site("bool")
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield site("int")
    elif isinstance(node, ast.Slice):
        for bound in ("lower", "upper"):
            value = getattr(node, bound)
            if value is not None and not isinstance(value, ast.Constant):
                yield site("slice_" + bound)
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            yield site("return")
    elif isinstance(node, (ast.Break, ast.Continue)):
        yield site("loopjump")
    if isinstance(node, ast.AugAssign):
        yield site("binop")
    if _deletable(node):
        yield site("delete")


def _deletable(node: ast.AST) -> bool:
    if isinstance(node, (ast.Expr, ast.AugAssign, ast.Raise, ast.Delete)):
        return not _is_docstring(node)
    if isinstance(node, ast.Assign):
        return all(isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets)
    return False


def _plus_one(expr: ast.expr) -> ast.expr:
    return ast.copy_location(ast.BinOp(expr, ast.Add(), ast.Constant(1)), expr)


def _replace(s: _Site, new: ast.AST) -> None:
    assert s.parent is not None and s.field_name is not None
    if s.position is None:
        setattr(s.parent, s.field_name, new)
    else:
        getattr(s.parent, s.field_name)[s.position] = new


def _apply(s: _Site) -> tuple[str, str]:
    """Mutate the tree at ``s`` in place; returns (before, after) source text."""
    node = s.node
    before = ast.unparse(node)
    if s.kind == "delete":
        _replace(s, ast.copy_location(ast.Pass(), node))
        return before, "(deleted)"
    if s.kind == "compare":
        assert isinstance(node, ast.Compare)
        node.ops[s.detail] = _COMPARE_FLIP[type(node.ops[s.detail])]()
    elif s.kind == "boolop":
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif s.kind == "binop":
        assert isinstance(node, (ast.BinOp, ast.AugAssign))
        node.op = _BINOP_SWAP[type(node.op)]()
    elif s.kind == "unary":
        assert isinstance(node, ast.UnaryOp)
        _replace(s, node.operand)
        return before, ast.unparse(node.operand)
    elif s.kind == "maxmin":
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        node.func.id = "min" if node.func.id == "max" else "max"
    elif s.kind == "bool":
        assert isinstance(node, ast.Constant)
        node.value = not node.value
    elif s.kind == "int":
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        node.value = node.value + 1
    elif s.kind.startswith("slice_"):
        assert isinstance(node, ast.Slice)
        bound = s.kind.removeprefix("slice_")
        setattr(node, bound, _plus_one(getattr(node, bound)))
    elif s.kind == "return":
        assert isinstance(node, ast.Return)
        node.value = ast.copy_location(ast.Constant(None), node)
    elif s.kind == "loopjump":
        new = ast.Continue() if isinstance(node, ast.Break) else ast.Break()
        _replace(s, ast.copy_location(new, node))
        return before, ast.unparse(new)
    return before, ast.unparse(node)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def enumerate_mutants(path: Path) -> list[Mutant]:
    source = path.read_text()
    text = source.splitlines()
    mutants = []
    for index, s in enumerate(_sites(ast.parse(source), _no_mutate_lines(source))):
        line = getattr(s.node, "lineno", 0)
        end = getattr(s.node, "end_lineno", line) or line
        # Describe it on a copy of the node, held by a stand-in parent: the tree stays as is.
        holder = SimpleNamespace(node=copy.deepcopy(s.node))
        stand_in = replace(s, node=holder.node, parent=holder, field_name="node", position=None)
        before, after = _apply(stand_in)
        mutation = f"`{_short(before)}` -> `{_short(after)}`"
        mutants.append(Mutant(index, line, end, s.function, mutation, text[line - 1].strip()))
    return mutants


def mutated_code(path: Path, index: int) -> CodeType:
    source = path.read_text()
    tree = ast.parse(source)
    site = list(_sites(tree, _no_mutate_lines(source)))[index]
    _apply(site)
    ast.fix_missing_locations(tree)
    return compile(tree, str(path), "exec", dont_inherit=True)


def _code_by_qualname(code: CodeType) -> dict[str, CodeType]:
    found: dict[str, CodeType] = {}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found.setdefault(const.co_qualname, const)
            for name, inner in _code_by_qualname(const).items():
                found.setdefault(name, inner)
    return found


def _live_functions(module: ModuleType) -> Iterator[Any]:
    """Every function object defined by ``module``: top level, in classes, unwrapped."""
    return _functions_in(vars(module), module.__name__)


def _functions_in(namespace: dict[str, Any], module_name: str) -> Iterator[Any]:
    seen: set[int] = set()

    def unwrap(obj: Any) -> Iterator[Any]:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for part in (obj.fget, obj.fset, obj.fdel):
                if part is not None:
                    yield from unwrap(part)
            return
        while hasattr(obj, "__wrapped__"):
            yield obj
            obj = obj.__wrapped__
        yield obj

    def walk(namespace: dict[str, Any]) -> Iterator[Any]:
        for value in list(namespace.values()):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, type) and value.__module__ == module_name:
                yield from walk(dict(vars(value)))
                continue
            for fn in unwrap(value):
                code = getattr(fn, "__code__", None)
                if code is not None and getattr(fn, "__module__", None) == module_name:
                    yield fn

    yield from walk(namespace)


def swap_in(module: ModuleType, path: Path, mutant: Mutant) -> bool:
    """Put the mutant's code into the live function; False if it cannot be done in place."""
    assert mutant.function is not None
    new = _code_by_qualname(mutated_code(path, mutant.index)).get(mutant.function)
    if new is None:
        return False
    for fn in _live_functions(module):
        code = fn.__code__
        if code.co_qualname == mutant.function and code.co_filename == str(path):
            try:
                fn.__code__ = new
            except ValueError:  # a closure's free variables changed
                return False
            return True
    return False


_PLAIN = (int, float, str, bytes, bool, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, tuple | frozenset):
        return all(_plain(v) for v in value)
    return type(value) in _PLAIN


@dataclass
class ModuleLevelChange:
    """What a module-level mutant changes that can be patched into the live module: plain
    constants (and every module that imported them by name), plain class attributes, and
    functions' defaults (a dataclass field's default is its ``__init__``'s)."""

    constants: dict[str, Any]
    class_attributes: dict[str, dict[str, Any]]  # class qualname -> {attribute: value}
    defaults: dict[str, tuple[Any, Any]]  # qualname -> (__defaults__, __kwdefaults__)


def _by_qualname(objects: Iterable[Any]) -> dict[str, Any]:
    """Objects by ``__qualname__``, leaving out any name two of them share (ambiguous)."""
    found: dict[str, Any] = {}
    shared: set[str] = set()
    for obj in objects:
        name = obj.__qualname__
        if name in found and found[name] is not obj:
            shared.add(name)
        found[name] = obj
    return {name: obj for name, obj in found.items() if name not in shared}


def _classes_in(namespace: dict[str, Any], module_name: str) -> Iterator[type]:
    for value in list(namespace.values()):
        if isinstance(value, type) and value.__module__ == module_name:
            yield value
            yield from _classes_in(dict(vars(value)), module_name)


def _patched_values(old: tuple[Any, ...], new: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``old`` with the plain values that differ in ``new`` replaced; None if something else
    differs (an object that is not equal, a different count)."""
    if len(old) != len(new):
        return None
    out = []
    for was, now in zip(old, new, strict=True):
        if _differs(was, now):
            out.append(now)
        elif was is now or (type(was) is type(now) and was == now) or repr(was) == repr(now):
            # the live object: equal (an instance of the aside copy of a class is only equal
            # by its repr), and the one the rest of the code holds
            out.append(was)
        else:
            return None
    return tuple(out)


def _differs(old: Any, new: Any) -> bool:
    return _plain(old) and _plain(new) and (type(old) is not type(new) or old != new)


def module_level_change(module: ModuleType, path: Path, mutant: Mutant) -> ModuleLevelChange | None:
    """Run the mutated module body aside and diff it with the live module. None: nothing
    patchable changed (an object, an enum, a table): the mutant needs a fresh import. Raises
    what the mutated body raises (the mutant does not import: killed)."""
    namespace: dict[str, Any] = {"__name__": module.__name__, "__file__": str(path)}
    namespace["__package__"] = module.__package__
    exec(mutated_code(path, mutant.index), namespace)
    live = vars(module)
    constants = {
        name: new for name, new in namespace.items() if name in live and _differs(live[name], new)
    }
    class_attributes = {}
    mutated_classes = _by_qualname(_classes_in(namespace, module.__name__))
    for name, cls in _by_qualname(_classes_in(live, module.__name__)).items():
        other = mutated_classes.get(name)
        if other is None:
            continue
        old_attrs, new_attrs = vars(cls), vars(other)
        changed = {
            k: v
            for k, v in new_attrs.items()
            if k in old_attrs and not k.startswith("__") and _differs(old_attrs[k], v)
        }
        if changed:
            class_attributes[name] = changed
    mutated = _by_qualname(_functions_in(namespace, module.__name__))
    defaults = {}
    for name, fn in _by_qualname(_live_functions(module)).items():
        other = mutated.get(name)
        if other is None:
            continue
        positional = _patched_values(fn.__defaults__ or (), other.__defaults__ or ())
        keywords = fn.__kwdefaults__ or {}
        new_keywords = other.__kwdefaults__ or {}
        patched_keywords = _patched_values(
            tuple(keywords.get(k) for k in new_keywords), tuple(new_keywords.values())
        )
        if positional is None or patched_keywords is None or set(keywords) != set(new_keywords):
            return None  # a default changed that is not a plain value
        if positional != (fn.__defaults__ or ()) or patched_keywords != tuple(keywords.values()):
            defaults[name] = (
                positional or None,
                dict(zip(new_keywords, patched_keywords, strict=True)) or None,
            )
    for name, cls in mutated_classes.items():
        # a dataclass's field defaults live in its __init__: a class attribute alone is not it
        init = f"{name}.__init__"
        if (
            name in class_attributes
            and hasattr(cls, "__dataclass_fields__")
            and init not in defaults
        ):
            return None
    if not constants and not class_attributes and not defaults:
        return None
    return ModuleLevelChange(constants, class_attributes, defaults)


def imported_elsewhere(module: ModuleType, names: Iterable[str]) -> bool:
    """Does another loaded module hold one of these constants under the same name?"""
    live = vars(module)
    for other in list(sys.modules.values()):
        namespace = getattr(other, "__dict__", None)
        if other is module or namespace is None:
            continue
        if any(name in namespace and namespace[name] is live[name] for name in names):
            return True
    return False


def patch_in(module: ModuleType, change: ModuleLevelChange) -> None:
    live = vars(module)
    for other in list(sys.modules.values()):
        namespace = getattr(other, "__dict__", None)
        if namespace is None or other is module:
            continue
        for name, new in change.constants.items():
            if name in namespace and namespace[name] is live[name]:
                namespace[name] = new
    live.update(change.constants)
    classes = _by_qualname(_classes_in(live, module.__name__))
    for name, attributes in change.class_attributes.items():
        for attribute, value in attributes.items():
            setattr(classes[name], attribute, value)
    for name, fn in _by_qualname(_live_functions(module)).items():
        pair = change.defaults.get(name)
        if pair is not None:
            fn.__defaults__, fn.__kwdefaults__ = pair


def lines_naming(path: Path, names: Iterable[str]) -> set[int]:
    """Lines of the module that read one of these globals."""
    wanted = set(names)
    return {
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Name) and node.id in wanted
    }


# ---------------------------------------------------------------------------- processes


def _module_name(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def _prepare_child(quiet: bool = True) -> None:
    os.setpgid(0, 0)  # the driver kills a timed-out child's whole group
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)


def _fork(run: Callable[[], int]) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 3
        try:
            code = run()
        finally:
            os._exit(code)
    return pid


def _wait(pid: int, timeout_s: float) -> int | None:
    """Exit code of ``pid``, or None after killing its group at the timeout."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for target in (-pid, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


_PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-m", "not slow"]


class _MutatedSource(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one module's mutated code to a fresh import."""

    def __init__(self, name: str, code: CodeType, path: Path):
        self.name, self.code, self.path = name, code, path

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.code, module.__dict__)


# ---------------------------------------------------------------------------- the session


@dataclass
class Result:
    mutant: Mutant
    status: str  # killed, timed out, survived, equivalent
    note: str = ""  # "no test reaches it", "ran N tests", the equivalence reason


@dataclass
class Baseline:
    lines_by_test: dict[str, list[int]] = field(default_factory=dict)
    seconds_by_test: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


class _SessionPlugin:
    """Inside one pytest session: baseline once, then one forked run per mutant."""

    def __init__(self, module: str, mutants: list[Mutant], out: Path, timeout_factor: float):
        self.module, self.mutants, self.out = module, mutants, out
        self.timeout_factor = timeout_factor
        self.path = ROOT / module

    def pytest_runtestloop(self, session: Any) -> bool:
        items = list(session.items)
        baseline = self._baseline(items)
        results = {"baseline": asdict(baseline), "results": {}}
        if not baseline.failed:
            by_id = {item.nodeid: item for item in items}
            for mutant in self.mutants:
                status, note = self._run(mutant, baseline, by_id)
                results["results"][str(mutant.index)] = [status, note]
        self.out.write_text(json.dumps(results))
        return True

    def _baseline(self, items: list[Any]) -> Baseline:
        from _pytest.runner import runtestprotocol

        report = self.out.with_suffix(".baseline.json")

        def run() -> int:
            target = str(self.path)
            lines: set[int] = set()

            def local(frame: FrameType, event: str, arg: Any) -> Any:
                if event == "line":
                    lines.add(frame.f_lineno)
                return local

            def tracer(frame: FrameType, event: str, arg: Any) -> Any:
                return local if frame.f_code.co_filename == target else None

            baseline = Baseline()
            for i, item in enumerate(items):
                nextitem = items[i + 1] if i + 1 < len(items) else None
                lines.clear()
                started = time.perf_counter()
                sys.settrace(tracer)
                try:
                    reports = runtestprotocol(item, nextitem=nextitem, log=False)
                finally:
                    sys.settrace(None)
                baseline.seconds_by_test[item.nodeid] = time.perf_counter() - started
                baseline.lines_by_test[item.nodeid] = sorted(lines)
                if any(r.failed for r in reports):
                    baseline.failed.append(item.nodeid)
            report.write_text(json.dumps(asdict(baseline)))
            return 0

        def child() -> int:
            _prepare_child()
            return run()

        pid = _fork(child)
        code = _wait(pid, 3600)
        if code != 0:
            return Baseline(failed=[f"baseline run ended with {code}"])
        return Baseline(**json.loads(report.read_text()))

    def _run(self, mutant: Mutant, baseline: Baseline, by_id: dict[str, Any]) -> tuple[str, str]:
        from _pytest.runner import runtestprotocol

        module = sys.modules[_module_name(self.module)]
        change: ModuleLevelChange | None = None
        if mutant.function is None:
            try:
                change = module_level_change(module, self.path, mutant)
            except Exception:
                return "killed", "the mutated module does not import"
            if change is None:
                return "module level", ""  # the driver imports it fresh instead
            reach = lines_naming(self.path, change.constants)
            # Used elsewhere (a test may read it without running a line of this module):
            # every test of the session.
            everywhere = (
                change.defaults
                or change.class_attributes
                or imported_elsewhere(module, change.constants)
            )
        else:
            reach = set(range(mutant.line, mutant.end_line + 1))
            everywhere = False
        if mutant.function is None and not any(
            reach.intersection(lines) for lines in baseline.lines_by_test.values()
        ):
            everywhere = True  # read only as an attribute (module.NAME): any test may
        chosen = [
            nodeid
            for nodeid, lines in baseline.lines_by_test.items()
            if (everywhere or reach.intersection(lines)) and nodeid in by_id
        ]
        if not chosen:
            return "survived", "no test reaches it"
        chosen.sort(key=lambda nodeid: baseline.seconds_by_test[nodeid])
        items = [by_id[nodeid] for nodeid in chosen]

        def run() -> int:
            _prepare_child()
            if change is not None:
                patch_in(module, change)
            elif not swap_in(module, self.path, mutant):
                return 4
            for i, item in enumerate(items):
                nextitem = items[i + 1] if i + 1 < len(items) else None
                if any(r.failed for r in runtestprotocol(item, nextitem=nextitem, log=False)):
                    return 1
            return 0

        expected = sum(baseline.seconds_by_test[nodeid] for nodeid in chosen)
        code = _wait(_fork(run), self.timeout_factor * expected + 5)
        return _status(code, len(chosen))


def _status(code: int | None, tests: int) -> tuple[str, str]:
    if code is None:
        return "timed out", ""
    if code == 0:
        return "survived", f"{tests} tests ran"
    if code == 4:
        return "module level", ""  # the driver imports it fresh instead
    return "killed", "" if code == 1 else f"the run ended with {code}"


def _session(
    module: str, mutants: list[Mutant], tests: list[str], timeout_factor: float
) -> dict[str, Any]:
    """Run the function-level mutants of ``module`` in one pytest session (a child process)."""
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        out = Path(tmp) / "session.json"

        def run() -> int:
            import pytest

            _prepare_child()
            plugin = _SessionPlugin(module, mutants, out, timeout_factor)
            pytest.main([*_PYTEST_ARGS, *tests], plugins=[plugin])
            return 0

        _wait(_fork(run), 6 * 3600)
        if not out.exists():
            raise SystemExit(f"{module}: the pytest session ended without results")
        return json.loads(out.read_text())


def _fresh(module: str, mutant: Mutant, order: Sequence[str], timeout_s: float) -> tuple[str, str]:
    """Import the mutated module fresh (module-level mutants) and run the module's tests."""
    path = ROOT / module

    def run() -> int:
        import pytest

        _prepare_child()
        sys.meta_path.insert(
            0, _MutatedSource(_module_name(module), mutated_code(path, mutant.index), path)
        )
        return int(pytest.main([*_PYTEST_ARGS, "-x", *order]))

    code = _wait(_fork(run), timeout_s)
    if code is None:
        return "timed out", ""
    # 0: passed; 1: a test failed; 2-4: interrupted or errors (the import itself failed).
    return ("survived", f"{len(order)} test files ran") if code == 0 else ("killed", "")


# ---------------------------------------------------------------------------- equivalents


def load_equivalents(path: Path = EQUIVALENTS_FILE) -> dict[tuple[str, str, str], str]:
    """(module, source line, mutation) -> reason: no line number, so edits elsewhere keep it."""
    if not path.exists():
        return {}
    table = tomllib.loads(path.read_text())
    return {
        (e["module"], e["source"], e["mutation"]): e["reason"] for e in table.get("equivalent", [])
    }


# ---------------------------------------------------------------------------- driver


def run_module(
    module: str,
    *,
    max_mutants: int | None = None,
    match: str | None = None,
    lines: tuple[int, int] | None = None,
    module_level: bool = False,
    only: set[tuple[str, str]] | None = None,
    timeout_factor: float = 3.0,
    tests: list[str] | None = None,
    equivalents_file: Path = EQUIVALENTS_FILE,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    path = ROOT / module
    tests = tests or test_files(module)
    mutants = enumerate_mutants(path)
    total_sites = len(mutants)
    if lines is not None:
        mutants = [m for m in mutants if lines[0] <= m.line <= lines[1]]
    if match is not None:
        mutants = [m for m in mutants if match in m.mutation or match == m.function]
    if module_level:
        mutants = [m for m in mutants if m.function is None]
    if only is not None:  # (file:line, mutation) pairs
        mutants = [m for m in mutants if (f"{module}:{m.line}", m.mutation) in only]
    if max_mutants is not None and len(mutants) > max_mutants:
        step = len(mutants) / max_mutants  # an even sample over the file
        mutants = [mutants[int(i * step)] for i in range(max_mutants)]
    started = time.monotonic()
    log(f"{module}: {len(mutants)} mutants ({total_sites} sites), tests: {tests}")
    session = _session(module, mutants, tests, timeout_factor)
    baseline = Baseline(**session["baseline"])
    if baseline.failed:
        raise SystemExit(f"{module}: the baseline is not green: {baseline.failed[:5]}")
    outcome = {int(k): tuple(v) for k, v in session["results"].items()}
    seconds_by_file: dict[str, float] = {}
    for nodeid, seconds in baseline.seconds_by_test.items():
        name = nodeid.split("::")[0]
        seconds_by_file[name] = seconds_by_file.get(name, 0.0) + seconds
    order = sorted(seconds_by_file, key=seconds_by_file.__getitem__)
    fresh_timeout = timeout_factor * sum(seconds_by_file.values()) + 30
    equivalents = load_equivalents(equivalents_file)
    results = []
    for mutant in mutants:
        status, note = outcome.get(mutant.index, ("module level", ""))
        if status == "module level":
            status, note = _fresh(module, mutant, order, fresh_timeout)
        if status == "survived":
            reason = equivalents.get((module, mutant.source, mutant.mutation))
            if reason is not None:
                status, note = "equivalent", reason
        results.append(Result(mutant, status, note))
        if status in ("survived", "equivalent"):
            log(f"  {status}: {module}:{mutant.line} {mutant.function} {mutant.mutation}")
    return summarize(
        module, results, tests, time.monotonic() - started, sampled=len(mutants) < total_sites
    )


def summarize(
    module: str, results: list[Result], tests: list[str], seconds: float, sampled: bool
) -> dict[str, Any]:
    count = {s: sum(r.status == s for r in results) for s in _STATUSES}
    mutants = len(results)
    caught = count["killed"] + count["timed out"]
    judged = mutants - count["equivalent"]
    return {
        "module": module,
        "date": datetime.date.today().isoformat(),
        "command": f"python -m scripts.mutate {module}",
        "tests": tests,
        "sampled": sampled,
        "seconds": round(seconds, 1),
        "mutants": mutants,
        "killed": count["killed"],
        "timed_out": count["timed out"],
        "survived": count["survived"],
        "equivalent": count["equivalent"],
        # Equivalent mutants cannot be killed: the score counts the ones that can.
        "score": round(caught / judged, 4) if judged else 1.0,
        "survivors": [
            {
                "where": f"{module}:{r.mutant.line}",
                "function": r.mutant.function,
                "mutation": r.mutant.mutation,
                "source": r.mutant.source,
                "status": r.status,
                "note": r.note,
            }
            for r in results
            if r.status in ("survived", "equivalent")
        ],
    }


_STATUSES = ("killed", "timed out", "survived", "equivalent")


def _update(previous: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """``previous`` with its survivors replaced by what a rerun of just them found."""
    entry = dict(previous)
    # a rerun may take in killed mutants with the same line and text: count from the rest
    for name in ("timed_out", "equivalent"):
        entry[name] = previous[name] + rerun[name]
    entry["survived"] = rerun["survived"]
    entry["killed"] = (
        entry["mutants"] - entry["survived"] - entry["equivalent"] - entry["timed_out"]
    )
    kept = [s for s in previous["survivors"] if s["status"] != "survived"]
    entry["survivors"] = kept + rerun["survivors"]
    judged = entry["mutants"] - entry["equivalent"]
    entry["score"] = round((entry["killed"] + entry["timed_out"]) / judged, 4) if judged else 1.0
    entry["date"] = rerun["date"]
    entry["seconds"] = round(previous["seconds"] + rerun["seconds"], 1)
    return entry


def markdown_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Module, mutants, killed, timed out, survived, equivalent, score: before -> after."""
    rows = [
        "| module | mutants | killed | timed out | survived | equivalent | score | date |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for module in MODULE_TESTS:
        old, new = before["modules"].get(module), after["modules"].get(module)
        if new is None:
            continue

        def pair(name: str, old: Any = old, new: Any = new) -> str:
            return f"{old[name]} → {new[name]}" if old else str(new[name])

        score = f"{old['score']:.1%} → {new['score']:.1%}" if old else f"{new['score']:.1%}"
        cells = [pair(n) for n in ("mutants", "killed", "timed_out", "survived", "equivalent")]
        rows.append(f"| `{module}` | {' | '.join(cells)} | {score} | {new['date']} |")
    return "\n".join(rows)


def _prepare_driver() -> None:
    # Heavy third-party imports once, before any fork; the project itself is never imported
    # here, so a fresh import in a child really is fresh.
    import cbor2  # noqa: F401
    import hypothesis
    import pytest  # noqa: F401
    import trio  # noqa: F401

    hypothesis.settings.register_profile(
        "mutation",
        max_examples=100,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    os.environ["HYPOTHESIS_PROFILE"] = "mutation"  # tests/conftest.py loads it by name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.mutate", description=__doc__)
    parser.add_argument("modules", nargs="*", help="e.g. store/hlc.py (default: the whole core)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON summary to update")
    parser.add_argument("--max-mutants", type=int, help="an even sample of at most N mutants")
    parser.add_argument("--match", help="only mutants whose mutation text or function is this")
    parser.add_argument("--lines", help="only mutants on lines FROM-TO")
    parser.add_argument("--module-level", action="store_true", help="only module-level mutants")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="rerun only the survivors of each module's entry in --out, and update it",
    )
    parser.add_argument("--tests", nargs="+", help="test files instead of the module's own")
    parser.add_argument("--timeout-factor", type=float, default=3.0)
    parser.add_argument(
        "--equivalents", type=Path, default=EQUIVALENTS_FILE, help="(/dev/null: count none)"
    )
    parser.add_argument(
        "--table", type=Path, metavar="BEFORE", help="print the markdown table of --out vs BEFORE"
    )
    args = parser.parse_args(argv)
    if args.table is not None:
        print(markdown_table(json.loads(args.table.read_text()), json.loads(args.out.read_text())))
        return 0
    modules = args.modules or list(MODULE_TESTS)
    unknown = [m for m in modules if m not in MODULE_TESTS]
    if unknown:
        parser.error(f"not in the core: {unknown}; choose from {list(MODULE_TESTS)}")
    lines = tuple(int(n) for n in args.lines.split("-")) if args.lines else None
    os.chdir(ROOT)
    _prepare_driver()
    summary: dict[str, Any] = {"modules": {}}
    if args.out.exists():
        summary = json.loads(args.out.read_text())
    for module in modules:
        previous = summary["modules"].get(module) if args.survivors else None
        only = None
        if previous is not None:
            only = {
                (s["where"], s["mutation"])
                for s in previous["survivors"]
                if s["status"] == "survived"
            }
        entry = run_module(
            module,
            max_mutants=args.max_mutants,
            match=args.match,
            lines=lines,  # type: ignore[arg-type]
            module_level=args.module_level,
            only=only,
            timeout_factor=args.timeout_factor,
            tests=args.tests,
            equivalents_file=args.equivalents,
        )
        if previous is not None:
            entry = _update(previous, entry)
        summary["modules"][module] = entry
        print(
            f"{module}: {entry['mutants']} mutants, {entry['killed']} killed, "
            f"{entry['timed_out']} timed out, {entry['survived']} survived, "
            f"{entry['equivalent']} equivalent: score {entry['score']:.1%} ({entry['seconds']} s)"
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
