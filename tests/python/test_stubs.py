"""The committed type stub python/ferry/_ferry.pyi matches the built module: regenerating it
with tools/packaging/gen_stubs.py gives the same text, so it cannot drift from the bindings."""

import ast
import importlib.util
import os

import pytest

from ferry import _ferry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB = os.path.join(ROOT, "python", "ferry", "_ferry.pyi")


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_stubs", os.path.join(ROOT, "tools", "packaging", "gen_stubs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stub_matches_the_built_module():
    if not hasattr(_ferry, "kv"):  # pragma: no cover - a partial build
        pytest.skip("the built module lacks a submodule the stub describes")
    with open(STUB) as f:
        committed = f.read()
    generated = load_generator().generate(_ferry)
    assert generated == committed, (
        "python/ferry/_ferry.pyi is out of date: run "
        "PYTHONPATH=<build>/python python3 tools/packaging/gen_stubs.py")


def test_stub_names_every_public_member():
    tree = ast.parse(open(STUB).read())
    top = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    top |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in vars(_ferry) if not n.startswith("_")}
    assert public <= top, f"missing from the stub: {sorted(public - top)}"
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    methods = {n.name for n in engine.body if isinstance(n, ast.FunctionDef)}
    assert {"register_memory", "open_session", "add_peer", "describe"} <= methods
    assert os.path.exists(os.path.join(ROOT, "python", "ferry", "py.typed"))
