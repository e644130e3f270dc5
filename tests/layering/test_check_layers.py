"""Tests of the layering check on small made-up trees: each kind of wrong include is caught,
and a tree whose includes all run downward passes."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import check_layers  # noqa: E402


def tree(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path)


GOOD = {
    "include/ferry/status.h": "#pragma once\n",
    "include/ferry/types.h": '#include "ferry/status.h"\n',
    "include/ferry/engine.h": '#include "ferry/types.h"\n#include <vector>\n',
    "src/base/log.h": '#include "ferry/status.h"\n',
    "src/cuda/runtime.h": '#include "base/log.h"\n#include "ferry/types.h"\n',
    "src/transport/transport.h": '#include "cuda/runtime.h"\n',
    "src/transport/shm/core.h": '#include "transport/transport.h"\n',
    "src/transport/shm/core_test.cc": '#include "transport/shm/core.h"\n#include "testing/x.h"\n',
    "src/engine/engine.cc": '#include "ferry/engine.h"\n#include "transport/transport.h"\n',
    "src/engine/shm_hostile_test.cc": '#include "transport/shm/core.h"\n',
    "src/testing/x.h": '#include "engine/engine_core.h"\n',
    "src/embed/table.h": '#include "engine/engine_core.h"\n',
    "tools/main.cc": '#include "ferry/engine.h"\n#include "commands.h"\n',
    "tools/commands.h": "#pragma once\n",
    "python/ferry_py.cc": '#include "ferry/engine.h"\n#include "binding.h"\n',
}


def test_a_tree_that_runs_downward_passes(tmp_path):
    assert check_layers.check_tree(tree(tmp_path, GOOD)) == []


def problems_with(tmp_path, rel, text):
    files = dict(GOOD)
    files[rel] = text
    return check_layers.check_tree(tree(tmp_path, files))


def test_an_upward_include_is_caught(tmp_path):
    p = problems_with(tmp_path, "src/cuda/copy.h", '#include "ferry/engine.h"\n')
    assert len(p) == 1 and "src/cuda/copy.h:1" in p[0] and "above" in p[0]


def test_a_transport_including_another_is_caught(tmp_path):
    p = problems_with(tmp_path, "src/transport/ucx/x.cc", '#include "transport/shm/core.h"\n')
    assert len(p) == 1 and "transport ucx" in p[0] and "transport shm" in p[0]


def test_the_engine_including_a_transport_is_caught_outside_tests(tmp_path):
    p = problems_with(tmp_path, "src/engine/route.cc", '#include "transport/shm/core.h"\n')
    assert len(p) == 1 and "transport shm" in p[0]


def test_kv_and_embed_are_apart(tmp_path):
    p = problems_with(tmp_path, "src/kv/plan.cc", '#include "embed/table.h"\n')
    assert len(p) == 1 and "beside" in p[0]


def test_front_ends_use_public_headers_only(tmp_path):
    p = problems_with(tmp_path, "tools/x.cc", '#include "embed/table.h"\n')
    assert len(p) == 1 and "front end" in p[0]
    p = problems_with(tmp_path / "2", "python/x_test.cc", '#include "testing/x.h"\n')
    assert p == []


def test_only_tests_include_test_helpers(tmp_path):
    p = problems_with(tmp_path, "src/engine/session.cc", '#include "testing/x.h"\n')
    assert len(p) == 1 and "only tests" in p[0]


def test_public_headers_include_no_internals_and_are_placed(tmp_path):
    p = problems_with(tmp_path, "include/ferry/engine.h", '#include "base/log.h"\n')
    assert len(p) == 1 and "internal" in p[0]
    p = problems_with(tmp_path / "2", "include/ferry/new_thing.h", "#pragma once\n")
    assert len(p) == 1 and "layer" in p[0]


def test_main_exits_nonzero_on_a_violation(tmp_path, capsys):
    files = dict(GOOD)
    files["src/base/x.h"] = '#include "transport/transport.h"\n'
    assert check_layers.main(["check_layers.py", tree(tmp_path, files)]) == 1
    assert "src/base/x.h:1" in capsys.readouterr().out
    assert check_layers.main(["check_layers.py", tree(tmp_path / "ok", GOOD)]) == 0
