"""Code as the interpreter would resolve it: constant strings folded, aliases undone.

The monitor's rules are patterns over code (``_pytest``, ``os.walk('/')``), and a policy
that learns which spellings are flagged learns to spell them otherwise:
``import_module("_py" "test.python")``, ``"".join(reversed("nohtyp.tsetyp_"))``,
``getattr(m, "run" + "test")``, ``b64decode("X3B5dGVzdA==")``, ``import os as o; o.walk``.
So every file version is also read in a normal form: expressions over constants are
evaluated (concatenation, repetition, ``%``, f-strings, ``join``, slicing, string methods,
``chr``, ``bytes``, ``bytes.fromhex``, base64/base32/base16/hex/rot13/zlib decoding),
module and name aliases replaced by what they name (``import x as y``, ``from x import
y``, a name assigned once), and ``getattr(m, "a")``, ``import_module("a.b")``,
``__import__("a")`` and ``sys.modules["a"]`` written as the dotted names they reach. The
rules then search that text as well as the raw lines.

Only evaluation of constants happens here, never of the code: nothing is imported or run,
and results are capped in size.
"""

from __future__ import annotations

import ast
import base64
import binascii
import codecs
import copy
import functools
import zlib
from collections.abc import Callable
from typing import Any

_MAX_LENGTH = 10_000
_STR_METHODS = {
    "upper", "lower", "strip", "lstrip", "rstrip", "replace", "format", "encode", "decode",
    "swapcase", "title", "capitalize", "removeprefix", "removesuffix", "casefold", "join",
    "translate", "zfill", "center", "ljust", "rjust", "expandtabs",
}  # fmt: skip
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "base64.b64decode": base64.b64decode,
    "base64.urlsafe_b64decode": base64.urlsafe_b64decode,
    "base64.b32decode": base64.b32decode,
    "base64.b16decode": base64.b16decode,
    "base64.a85decode": base64.a85decode,
    "base64.b85decode": base64.b85decode,
    "base64.decodebytes": base64.decodebytes,
    "binascii.unhexlify": binascii.unhexlify,
    "binascii.a2b_hex": binascii.a2b_hex,
    "binascii.a2b_base64": binascii.a2b_base64,
    "bytes.fromhex": bytes.fromhex,
    "bytearray.fromhex": lambda text: bytes(bytearray.fromhex(text)),
    "zlib.decompress": zlib.decompress,
}
#: Functions ``map`` may apply while folding.
_PURE: dict[str, Callable[[Any], Any]] = {"chr": chr, "str": str, "ord": ord, "int": int}
_IMPORTERS = ("importlib.import_module", "__import__", "builtins.__import__")
_MODULE_LOOKUPS = ("sys.modules.get", "sys.modules.pop", "sys.modules.__getitem__")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _small(value: object) -> bool:
    return not isinstance(value, str | bytes) or len(value) <= _MAX_LENGTH


def _constant(node: ast.AST) -> tuple[bool, Any]:
    if isinstance(node, ast.Constant):
        return True, node.value
    if isinstance(node, ast.List | ast.Tuple):
        values = [_constant(e) for e in node.elts]
        if all(ok for ok, _ in values):
            items = [v for _, v in values]
            return True, items if isinstance(node, ast.List) else tuple(items)
    return False, None


def _assignments(tree: ast.Module) -> dict[str, ast.AST]:
    """The one value of each name bound exactly once in the module, by a plain assignment
    or an import; a name bound more than once (or as a parameter, loop variable, ...)
    is left alone."""
    count: dict[str, int] = {}
    value: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            count[node.id] = count.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            count[node.arg] = count.get(node.arg, 0) + 2
        elif isinstance(node, ast.FunctionDef) and (returned := _one_expression(node)):
            # ``def f(c): return expr``: inlined like ``f = lambda c: expr``
            count[node.name] = count.get(node.name, 0) + 1
            value[node.name] = ast.Lambda(args=node.args, body=returned)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            count[node.name] = count.get(node.name, 0) + 2
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                value[node.targets[0].id] = node.value
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                count[name] = count.get(name, 0) + 1
                if isinstance(node, ast.Import):
                    dotted = alias.name if alias.asname else name
                else:
                    dotted = f"{node.module or ''}.{alias.name}".lstrip(".")
                value[name] = ast.Name(id=dotted, ctx=ast.Load())
    return {name: node for name, node in value.items() if count.get(name) == 1}


def _one_expression(node: ast.FunctionDef) -> ast.expr | None:
    """The returned expression of a plain function whose whole body is one ``return``."""
    body = [s for s in node.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # fmt: skip
    if node.decorator_list or len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    return body[0].value


class _Folder(ast.NodeTransformer):
    def __init__(self, bound: dict[str, ast.AST]) -> None:
        self.bound = bound
        self.resolving: set[str] = set()

    def _name(self, name: str) -> ast.AST | None:
        if name not in self.bound or name in self.resolving:
            return None
        self.resolving.add(name)
        try:
            value = self.visit(ast.fix_missing_locations(_copy(self.bound[name])))
        finally:
            self.resolving.discard(name)
        if _constant(value)[0] or _dotted(value):
            return value
        return None

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load):
            resolved = self._name(node.id)
            same = isinstance(resolved, ast.Name) and resolved.id == node.id
            if resolved is not None and not same:
                return resolved
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        ok, value = _constant(node.operand)
        if ok and isinstance(value, int | float) and isinstance(node.op, ast.USub | ast.UAdd):
            return _fold(node, lambda: -value if isinstance(node.op, ast.USub) else value)
        return node

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        return self._comprehension(node)

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> ast.AST:
        return self._comprehension(node)

    def _comprehension(self, node: ast.ListComp | ast.GeneratorExp) -> ast.AST:
        """``[f(c) for c in CONSTANT]`` with ``f`` foldable: the list of results."""
        self.generic_visit(node)
        if len(node.generators) != 1:
            return node
        loop = node.generators[0]
        if loop.ifs or loop.is_async or not isinstance(loop.target, ast.Name):
            return node
        ok, items = _constant(loop.iter)
        if not ok or not isinstance(items, list | tuple | str | bytes) or len(items) > 1000:
            return node
        results = []
        name, outer = loop.target.id, self.bound.get(loop.target.id)
        for item in items:
            self.bound[name] = ast.Constant(item)
            try:
                folded = self.visit(_copy(node.elt))
            finally:
                if outer is None:
                    del self.bound[name]
                else:
                    self.bound[name] = outer
            folded_ok, value = _constant(folded)
            if not folded_ok:
                return node
            results.append(value)
        return _fold(node, lambda: results)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        (left_ok, left), (right_ok, right) = _constant(node.left), _constant(node.right)
        if not (left_ok and right_ok):
            return node
        operators: dict[type, Callable[[Any, Any], Any]] = {
            ast.Add: lambda a, b: a + b,
            ast.Mod: lambda a, b: a % b,
            ast.Mult: lambda a, b: a * b,
        }
        operate = operators.get(type(node.op))
        if operate is None:
            return node
        if isinstance(node.op, ast.Mult) and any(
            isinstance(v, int) and v > _MAX_LENGTH for v in (left, right)
        ):
            return node
        return _fold(node, lambda: operate(left, right))

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        parts: list[str] | None = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                folded = self.visit(value.value)
                ok, inner = _constant(folded)
                if ok and value.format_spec is None and value.conversion == -1:
                    parts = None if parts is None else [*parts, str(inner)]
                else:
                    parts = None
                # Only a fold the f-string can hold goes back in (Python 3.11 cannot write
                # a backslash or a quote inside an f-string's expression).
                if not (ok and isinstance(inner, str) and set(inner) & set("\\'\"\n")):
                    value.value = folded  # type: ignore[assignment]
            elif isinstance(value, ast.Constant):
                parts = None if parts is None else [*parts, str(value.value)]
            else:
                parts = None
        if parts is None:
            return node
        return ast.copy_location(ast.Constant("".join(parts)), node)

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        target = _dotted(node.value)
        ok, key = _constant(node.slice)
        if target == "sys.modules" and ok and isinstance(key, str):
            return ast.copy_location(ast.Name(id=key, ctx=ast.Load()), node)
        base_ok, base = _constant(node.value)
        if base_ok and isinstance(node.slice, ast.Slice):
            bounds = [_constant(p) if p else (True, None) for p in
                      (node.slice.lower, node.slice.upper, node.slice.step)]  # fmt: skip
            if all(ok for ok, _ in bounds):
                return _fold(node, lambda: base[slice(*(v for _, v in bounds))])
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = _dotted(node.func)
        args = [_constant(a) for a in node.args]
        if func in self.bound and isinstance(self.bound[func], ast.Lambda):
            inlined = self._inline(func, node, args)
            if inlined is not None:
                return inlined
        if func == "map" and len(node.args) == 2 and _dotted(node.args[0]) in _PURE:
            ok, items = args[1]
            if ok and isinstance(items, list | tuple | str | bytes) and len(items) <= 1000:
                convert = _PURE[str(_dotted(node.args[0]))]
                return _fold(node, lambda: [convert(item) for item in items])
        first_ok, first = args[0] if args else (False, None)
        if first_ok and isinstance(first, str) and func in (*_IMPORTERS, *_MODULE_LOOKUPS):
            return ast.copy_location(ast.Name(id=first, ctx=ast.Load()), node)
        if func in ("getattr", "setattr", "hasattr") and len(args) >= 2:
            ok, attribute = args[1]
            if ok and isinstance(attribute, str) and attribute.isidentifier():
                reached = ast.Attribute(value=node.args[0], attr=attribute, ctx=ast.Load())
                if func == "getattr":
                    return ast.copy_location(reached, node)
                node.args[1] = reached  # setattr(m, "a", v) reads as setattr(m, m.a, v)
                return node
        if node.keywords or not all(ok for ok, _ in args):
            return node
        return self._call_on_constants(node, func, [v for _, v in args])

    def _inline(self, name: str, node: ast.Call, args: list[tuple[bool, Any]]) -> ast.AST | None:
        """``f(consts)`` where ``f`` is a lambda (or one-return function) bound once: its
        body evaluated with the parameters bound to the constants."""
        function = self.bound[name]
        assert isinstance(function, ast.Lambda)
        spec = function.args
        if node.keywords or name in self.resolving or spec.kwonlyargs or spec.kwarg:
            return None
        if not all(ok for ok, _ in args) or spec.posonlyargs:
            return None
        names = [a.arg for a in spec.args]
        values = [v for _, v in args]
        if len(values) < len(names) or (len(values) > len(names) and spec.vararg is None):
            return None
        bindings: dict[str, ast.AST] = {
            n: ast.Constant(v) for n, v in zip(names, values[: len(names)], strict=True)
        }
        if spec.vararg is not None:
            rest = values[len(names) :]
            bindings[spec.vararg.arg] = ast.Tuple(elts=[ast.Constant(v) for v in rest],
                                                  ctx=ast.Load())  # fmt: skip
        saved = {key: self.bound.get(key) for key in bindings}
        self.bound.update(bindings)
        self.resolving.add(name)
        try:
            body = self.visit(_copy(function.body))
        finally:
            self.resolving.discard(name)
            for key, previous in saved.items():
                if previous is None:
                    del self.bound[key]
                else:
                    self.bound[key] = previous
        return ast.copy_location(body, node) if _constant(body)[0] else None

    def _call_on_constants(self, node: ast.Call, func: str | None, values: list[Any]) -> ast.AST:
        if func in _DECODERS and len(values) == 1:
            return _fold(node, lambda: _DECODERS[func](values[0]))
        if func == "codecs.decode" and len(values) == 2 and isinstance(values[1], str):
            return _fold(node, lambda: codecs.decode(values[0], values[1]))
        if func == "chr" and len(values) == 1:
            return _fold(node, lambda: chr(values[0]))
        if func in ("bytes", "bytearray") and len(values) == 1 and isinstance(values[0], list):
            return _fold(node, lambda: bytes(values[0]))
        if func in ("reversed", "list", "sorted") and len(values) == 1 and _small(values[0]):
            ordered: dict[str, Callable[[Any], list[Any]]] = {
                "reversed": lambda v: list(reversed(v)), "list": list, "sorted": sorted,
            }  # fmt: skip
            return _fold(node, lambda: ordered[str(func)](values[0]))
        if func == "str.join" and len(values) == 2:
            return _fold(node, lambda: values[0].join(values[1]))
        if isinstance(node.func, ast.Attribute) and node.func.attr in _STR_METHODS:
            ok, owner = _constant(node.func.value)
            if ok and isinstance(owner, str | bytes):
                return _fold(node, lambda: getattr(owner, node.func.attr)(*values))  # type: ignore[attr-defined]
        return node


def _copy(node: ast.AST) -> ast.AST:
    return copy.deepcopy(node)


def _fold(node: ast.AST, compute: Callable[[], Any]) -> ast.AST:
    try:
        value = compute()
    except Exception:  # a constant expression that raises is left as written
        return node
    if isinstance(value, bytearray):
        value = bytes(value)
    if isinstance(value, list | tuple):
        if len(value) > _MAX_LENGTH or not all(isinstance(v, str | bytes | int) for v in value):
            return node
        elements: list[ast.expr] = [ast.Constant(v) for v in value]
        container = ast.List(elts=elements, ctx=ast.Load())
        return ast.copy_location(container, node)
    if not isinstance(value, str | bytes | int | float) or not _small(value):
        return node
    return ast.copy_location(ast.Constant(value), node)


@functools.lru_cache(maxsize=256)
def normalized_source(source: str) -> str | None:
    """``source`` with constants folded and aliases undone; None if it does not parse.

    Each top-level statement is written on its own, so one that cannot be written back
    (the interpreter's ``ast.unparse`` refuses a few folded forms) stays as it was and the
    rest of the file is still normalised.
    """
    try:
        tree = ast.parse(source)
        original = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    try:
        folded = ast.fix_missing_locations(_Folder(_assignments(tree)).visit(tree))
    except Exception:  # the monitor must read on: the raw lines are still checked
        return None
    lines = []
    for statement, unfolded in zip(folded.body, original.body, strict=True):
        try:
            lines.append(ast.unparse(statement))
        except Exception:  # a folded form the interpreter cannot write back
            lines.append(ast.get_source_segment(source, unfolded) or "")
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def decoded_strings(source: str) -> tuple[str, ...]:
    """Every string or bytes constant in the normal form, decoded: code hidden in a string
    that is later run (``exec``, a written file) is searched as code."""
    normal = normalized_source(source)
    if normal is None:
        return ()
    found = []
    for node in ast.walk(ast.parse(normal)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            text = (
                node.value if isinstance(node.value, str) else node.value.decode(errors="replace")
            )
            if "\n" in text or len(text) > 8:
                found.append(text)
    return tuple(found)
