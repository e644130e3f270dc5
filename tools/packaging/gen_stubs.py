#!/usr/bin/env python3
"""Writes python/ferry/_ferry.pyi, the type stub of the compiled module, from the built module.

pybind11 puts each function's signature in the first line of its docstring (several numbered
lines for an overloaded one); this script reads them, makes every type a name the stub
defines (a class of the module, a builtin, typing's, numpy's) or Any, and writes classes,
functions, properties and constants with their docstrings. The submodules kv, embed and
embed_service become classes of static members, the closest a one-file stub comes to them.

    PYTHONPATH=<build>/python python3 tools/packaging/gen_stubs.py [--check] [OUTPUT]

--check compares with OUTPUT (default: python/ferry/_ferry.pyi) instead of writing, and fails
when they differ (tests/python/test_stubs.py runs it, so the stub cannot drift).
"""

import ast
import inspect
import os
import re
import sys

HEADER = '''# The type stub of ferry._ferry, written by tools/packaging/gen_stubs.py from the built module.
# Do not edit: change the bindings' docstrings and run the script again.
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union, overload

import numpy
'''
TYPING = {"Any", "Callable", "Dict", "Iterable", "Iterator", "List", "Optional", "Sequence", "Tuple",
          "Union"}
BUILTINS = {"int", "float", "str", "bytes", "bool", "None", "object", "list", "dict", "tuple",
            "bytearray", "memoryview", "type"}
SUBMODULES = ("kv", "embed", "embed_service")


class Names:
    """Where each class of the module lives in the stub: "Engine", "kv.Connector", ..."""

    def __init__(self, module):
        self.where = {}
        for name, obj in vars(module).items():
            if inspect.isclass(obj):
                self.where.setdefault(name, name)
        for sub in SUBMODULES:
            for name, obj in vars(getattr(module, sub)).items():
                if inspect.isclass(obj):
                    self.where.setdefault(name, f"{sub}.{name}")

    def type_of(self, node, scope):
        """Rewrites an annotation's names in place; returns False when one cannot be placed."""
        for n in ast.walk(node):
            if isinstance(n, (ast.Name, ast.Attribute)):
                dotted = ast.unparse(n)
                last = dotted.split(".")[-1]
                if dotted in BUILTINS or dotted in TYPING or dotted.startswith("numpy."):
                    continue
                if last in self.where:
                    target = self.where[last]
                    if scope and target.startswith(scope + "."):
                        target = target[len(scope) + 1:]
                    n.__class__ = ast.Name
                    n.__dict__.clear()
                    n.id, n.ctx = target, ast.Load()
        return all(
            isinstance(n, ast.Name) and (n.id in BUILTINS or n.id in TYPING or n.id.split(".")[0]
                                         in set(self.where.values()) | set(SUBMODULES) | {"numpy"}
                                         or n.id.split(".")[-1] in self.where)
            for n in ast.walk(node) if isinstance(n, ast.Name))


def clean_annotation(text, names, scope):
    text = text.replace("::", ".")
    text = re.sub(r"numpy\.ndarray\[[^\]]*\]", "numpy.ndarray", text)
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return "Any"
    return ast.unparse(node) if names.type_of(node, scope) else "Any"


def signature(line, names, scope, is_method):
    """'name(a: T = d, ...) -> R' as a stub's 'def name(...) -> R', or None when unreadable."""
    m = re.match(r"^(\w+)\((.*)\)(?: -> (.+))?$", line.strip())
    if not m:
        return None
    fname, args, ret = m.group(1), m.group(2), m.group(3) or "None"
    # Split on commas outside brackets and quotes.
    parts, depth, cur, quote = [], 0, "", None
    for ch in args:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    out = []
    for i, p in enumerate(parts):
        if p in ("*", "/") or p.startswith("*"):
            out.append(p.split(":")[0].strip() if p.startswith("*") and ":" in p else p)
            continue
        pm = re.match(r"^(\w+)(?:\s*:\s*(.+?))?(?:\s*=\s*(.+))?$", p)
        if not pm:
            return None
        name, ann, default = pm.group(1), pm.group(2), pm.group(3)
        if i == 0 and is_method and name == "self":
            out.append("self")
            continue
        item = name + (": " + clean_annotation(ann, names, scope) if ann else "")
        if default is not None:
            try:
                ast.literal_eval(default)
                item += " = " + default if len(default) < 60 else " = ..."
            except (ValueError, SyntaxError):
                item += " = ..."
        out.append(item)
    return f"def {fname}({', '.join(out)}) -> {clean_annotation(ret, names, scope)}: ..."


def doc_lines(doc, indent):
    """The docstring after the signature lines, as a stub docstring (or nothing)."""
    body = "\n".join(l for l in doc.split("\n") if not re.match(r"^(\d+\. )?\w+\(.*\)( -> .+)?$", l))
    body = re.sub(r"\n{3,}", "\n\n", body).strip().replace("Overloaded function.", "").strip()
    if not body:
        return []
    body = body.replace("\\", "\\\\").replace('"""', "'''")
    lines = body.split("\n")
    return [indent + '"""' + lines[0]] + [(indent + l).rstrip() for l in lines[1:]] + [indent + '"""']


def function(name, obj, names, scope, indent, kind):
    """Stub lines of a function, method (kind "method") or static method (kind "static")."""
    doc = obj.__doc__ or ""
    sigs = [l for l in doc.split("\n") if re.match(rf"^(\d+\. )?{re.escape(name)}\(", l)]
    numbered = [re.sub(r"^\d+\. ", "", l) for l in sigs if re.match(r"^\d+\. ", l)]
    sigs = numbered or sigs  # an overloaded function: its numbered signatures
    defs = [signature(s, names, scope, kind == "method") for s in sigs]
    defs = [d for d in defs if d]
    if not defs:
        first = "self, " if kind == "method" else ""
        defs = [f"def {name}({first}*args: Any, **kwargs: Any) -> Any: ..."]
    out = []
    for d in defs:
        if len(defs) > 1:
            out.append(indent + "@overload")
        if kind == "static":
            out.append(indent + "@staticmethod")
        out.append(indent + d[: -len(" ...")] if doc_lines(doc, "") else indent + d)
        if doc_lines(doc, ""):
            out.extend(doc_lines(doc, indent + "    "))
            out.append(indent + "    ...")
    return out


class Documented:
    """A Python function seen as pybind11 shows one: its signature as the docstring's first line."""

    def __init__(self, name, func):
        self.__doc__ = f"{name}{inspect.signature(func)}\n\n{inspect.getdoc(func) or ''}"


def constant(name, value, indent):
    return [f"{indent}{name}: {type(value).__name__}"]


def klass(name, cls, names, scope, indent):
    out = [f"{indent}class {name}:"]
    out.extend(doc_lines(cls.__doc__ or "", indent + "    "))
    inner = indent + "    "
    for attr, obj in sorted(vars(cls).items()):
        if attr.startswith("_") and attr not in ("__init__", "__enter__", "__exit__", "__len__",
                                                 "__iter__", "__getitem__", "__eq__", "__repr__"):
            continue
        if isinstance(obj, property):
            ret = "Any"
            fdoc = (obj.fget.__doc__ or "") if obj.fget else ""
            m = re.match(r"^\((?:self|arg0): [^)]*\) -> (.+)$", fdoc.split("\n")[0])
            if m:
                ret = clean_annotation(m.group(1), names, scope)
            out.append(f"{inner}@property")
            out.append(f"{inner}def {attr}(self) -> {ret}: ...")
            if obj.fset is not None:
                out.append(f"{inner}@{attr}.setter")
                out.append(f"{inner}def {attr}(self, value: {ret}) -> None: ...")
        elif isinstance(obj, staticmethod) or inspect.isfunction(obj):
            # Python functions (ferry/__init__.py adds Engine.create and register_tensor) carry
            # their signature in inspect.signature rather than in the docstring.
            func = obj.__func__ if isinstance(obj, staticmethod) else obj
            kind = "static" if isinstance(obj, staticmethod) else "method"
            if inspect.isfunction(func):
                func = Documented(attr, func)
            out.extend(function(attr, func, names, scope, inner, kind))
        elif callable(obj) and type(obj).__name__ in ("instancemethod", "builtin_function_or_method",
                                                      "function", "wrapper_descriptor"):
            if type(obj).__name__ == "wrapper_descriptor":
                continue
            out.extend(function(attr, obj, names, scope, inner, "method"))
        elif isinstance(obj, (int, str, bytes, float, tuple)):
            out.extend(constant(attr, obj, inner))
    if len(out) == 1:
        out.append(inner + "...")
    return out


def members(module, names, scope, indent):
    out = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("__") or inspect.ismodule(obj):
            continue
        if inspect.isclass(obj):
            out.append("")
            out.extend(klass(name, obj, names, scope, indent))
        elif callable(obj):
            out.extend(function(name, obj, names, scope, indent, "static" if scope else "function"))
        elif isinstance(obj, (int, str, bytes, float, tuple)):
            out.extend(constant(name, obj, indent))
    return out


def generate(module):
    names = Names(module)
    out = HEADER.split("\n") + members(module, names, "", "")
    for sub in SUBMODULES:
        m = getattr(module, sub)
        out += ["", "", f"class {sub}:"] + doc_lines(m.__doc__ or "", "    ")
        out += members(m, names, sub, "    ")
    text = "\n".join(out).rstrip() + "\n"
    ast.parse(text)  # the stub is valid Python
    return text


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = args[0] if args else os.path.join(root, "python", "ferry", "_ferry.pyi")
    from ferry import _ferry

    text = generate(_ferry)
    if check:
        with open(path) as f:
            if f.read() != text:
                print(f"{path} is out of date: run {' '.join(['tools/packaging/gen_stubs.py'] + args)}")
                return 1
        return 0
    with open(path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
