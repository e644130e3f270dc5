#!/usr/bin/env python3
"""Renders the Python module's reference as Markdown (for doxygen, docs/Doxyfile): the package
docstrings of ferry, ferry.kv, ferry.embed and ferry.embed_service, then every class and
function of the compiled module with its signature and docstring, as the stub has them.

    PYTHONPATH=<build>/python python3 tools/packaging/python_api_md.py OUTPUT.md
"""

import importlib.util
import inspect
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def gen_stubs():
    spec = importlib.util.spec_from_file_location("gen_stubs", os.path.join(HERE, "gen_stubs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import ferry
    from ferry import _ferry, embed, embed_service, kv

    out = ["# Python API {#python_api}", "",
           "The `ferry` package (`import ferry`). Generated from the built module's docstrings;",
           "the type stub python/ferry/_ferry.pyi holds the same signatures.", ""]
    for mod in (ferry, kv, embed, embed_service):
        out += [f"## {mod.__name__}", "", "```", inspect.getdoc(mod) or "", "```", ""]
    # The stub's text, section by section: a class or function, its signature and docstring.
    out += ["## Classes and functions of the compiled module", "", "```python",
            gen_stubs().generate(_ferry).split("import numpy\n", 1)[1].strip(), "```", ""]
    with open(argv[0], "w") as f:
        f.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
