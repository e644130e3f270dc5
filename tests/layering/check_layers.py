#!/usr/bin/env python3
"""Checks that ferry's #include graph runs only downward through its layers.

    base <- types <- cuda <- transport <- engine <- (kv, embed) <- (python, tools)

A file may include headers of its own layer and of the layers below it, never above, and never
sideways: one transport folder does not include another's headers (nor does the transport core
in src/transport/ include any transport's), and kv and embed do not include each other. Above the
transports only their shared core (src/transport/*.h) is seen; tests of the engine over one
transport may use that transport's internals (e.g. its wire format, to play a hostile peer). The
front ends (tools/, python/) include only the public headers (include/ferry/) and their own
folder's; test files anywhere may also include the test helpers in src/testing/, and only test
files and src/testing/ itself may. Public headers belong to the layer that implements them
(PUBLIC_LAYER below); a public header may include only public headers of its layer or below.

Usage: check_layers.py [ROOT]   (ROOT: the repository, default: two folders up from here)
Prints each violation as `path:line: what`; exits 1 when there is any, 0 otherwise.
"""

import os
import re
import sys

RANK = {"base": 0, "types": 1, "cuda": 2, "transport": 3, "engine": 4, "kv": 5, "embed": 5,
        "frontend": 6}

# The layer that implements each public header. A header not listed here fails the check, so
# that a new public header is placed deliberately.
PUBLIC_LAYER = {
    "status.h": "base",
    "log.h": "base",
    "shared_memory.h": "base",
    "types.h": "types",
    "options.h": "types",
    "descriptors.h": "types",
    "gpu.h": "cuda",
    "gpu.h": "cuda",
    "system.h": "engine",
    "engine.h": "engine",
    "metrics.h": "engine",
    "embed.h": "embed",
    "embed_service.h": "embed",
    "embed_server.h": "embed",
    "embed_stats.h": "embed",
    "embed_server.h": "embed",
    "embed_stats.h": "embed",
    "kv.h": "kv",
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".in")


def is_test(path):
    name = os.path.basename(path)
    # Tests, and the headers only tests include (named *_test_util.h).
    return bool(re.search(r"(_test\.(cc|cpp|cu)|_test_util\.h)$", name)) or name.startswith("test_")


def unit_of(rel):
    """(layer, component) of a file, by its path relative to the root; None if unchecked."""
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "ferry":
        layer = PUBLIC_LAYER.get(parts[2])
        return (layer or "?", "public")
    if parts[0] == "src" and len(parts) >= 3:
        top = parts[1]
        if top == "testing":
            return ("testing", "testing")
        if top == "transport":
            # src/transport/<name>/... is one transport; files directly in src/transport/ are
            # the core that every transport shares.
            return ("transport", parts[2] if len(parts) >= 4 else "core")
        if top in RANK:
            return (top, top)
        return ("?", top)
    if parts[0] in ("tools", "python"):
        return ("frontend", parts[0])
    return None


def target_of(inc, rel):
    """(layer, component) of an included header; None for a header outside ferry."""
    parts = inc.split("/")
    if parts[0] == "ferry" and len(parts) == 2:
        return (PUBLIC_LAYER.get(parts[1], "?"), "public")
    if parts[0] == "testing":
        return ("testing", "testing")
    if parts[0] == "transport":
        return ("transport", parts[1] if len(parts) >= 3 else "core")
    if parts[0] in RANK and parts[0] != "frontend":
        return (parts[0], parts[0])
    # A path relative to the including file's folder (tools' and python's own headers, a
    # generated file) belongs to the includer's unit.
    return None


def check_file(root, rel):
    unit = unit_of(rel)
    if unit is None:
        return []
    layer, comp = unit
    problems = []
    test = is_test(rel)
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    if layer == "?":
        return [f"{rel}:1: file outside every layer ({comp}); place it in one or list it in "
                f"tests/layering/check_layers.py"]
    for n, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        inc = m.group(1)
        tgt = target_of(inc, rel)
        if tgt is None:
            continue
        t_layer, t_comp = tgt
        where = f"{rel}:{n}"
        if t_layer == "?":
            problems.append(f"{where}: includes \"{inc}\", which belongs to no layer")
            continue
        if t_layer == "testing":
            if not (test or layer == "testing"):
                problems.append(f"{where}: only tests and src/testing/ may include \"{inc}\"")
            continue
        if layer == "testing":
            continue  # test helpers may use every layer
        if layer == "frontend":
            if t_comp != "public":
                problems.append(f"{where}: front end includes the internal \"{inc}\" "
                                f"(front ends use include/ferry/ only)")
            continue
        if comp == "public" and t_comp != "public":
            problems.append(f"{where}: public header includes the internal \"{inc}\"")
            continue
        if RANK[t_layer] > RANK[layer]:
            problems.append(f"{where}: {layer} includes \"{inc}\" of the {t_layer} layer above it")
            continue
        if RANK[t_layer] == RANK[layer] and t_layer != layer:
            problems.append(f"{where}: {layer} includes \"{inc}\" of {t_layer}, beside it")
            continue
        if t_layer == "transport" and t_comp not in (comp, "core"):
            if layer == "transport":
                what = "the transport core" if comp == "core" else f"transport {comp}"
                problems.append(f"{where}: {what} includes \"{inc}\" of transport {t_comp}")
            elif not test:
                # Above the transports only the shared core is seen; tests of the engine over
                # one transport may use its internals (its wire format, to play a hostile peer).
                problems.append(f"{where}: {layer} includes \"{inc}\" of transport {t_comp} "
                                f"(only the transport core, src/transport/*.h, is seen above)")
    return problems


def check_tree(root):
    problems = []
    for top in ("include", "src", "tools", "python"):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXT):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    problems += check_file(root, rel.replace(os.sep, "/"))
    return problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = check_tree(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} include(s) against the layers "
              f"(base <- types <- cuda <- transport <- engine <- kv/embed <- python/tools)")
        return 1
    print("layering: every include runs downward")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
