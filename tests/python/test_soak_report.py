"""The chaos soak's verdict (tests/soak/report.py): every broken invariant is named, with what
broke it, so that a failed run's last line says why without its figures."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "soak"))

import report  # noqa: E402


def _tally(**final):
    t = report.Tally()
    t.record("kvw.consumer", 0, {"ev": "tick", "c": {"issued": 5, "ok": 5}})
    t.record("kvw.consumer", 0, {"ev": "final", "c": {"issued": 5, "ok": 5}, **final})
    return t


def _summary(t):
    return t.summary(8, (1.5, 64 << 20), None)


def test_a_clean_run_breaks_nothing():
    r = _summary(_tally())
    assert r["ok"] and r["broken"] == []


def test_each_broken_invariant_is_named_with_its_cause(tmp_path):
    t = _tally(outstanding=2, blocks_leaked=3)
    t.record("batch.sender", 1, {"ev": "tick", "c": {"issued": 1}, "overdue": ["r7"]})
    t.crash("kvr.producer", 2, -11, "Segmentation fault", ["nothing known"])
    t.crash("kvr.consumer", 1, -6, "Aborted", ["ucx: Assertion `comp->count > 0' failed"])
    (tmp_path / "w.log").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                    "ValueError: bad block\n")
    t.scan_logs(str(tmp_path))
    r = _summary(t)
    assert not r["ok"]
    text = ", ".join(r["broken"])
    assert "requests_hung=3" in text  # one overdue, two outstanding at the end
    assert "hung_in=['batch.sender', 'kvw.consumer']" in text
    assert "blocks_leaked=3" in text
    assert "unexpected_exits=kvr.producer#2 exited -11" in text
    assert "kvr.consumer" not in text  # UCX 1.13's own assertion is listed apart
    assert r["known_ucx_aborts"] and "tracebacks_in_logs=1" in text
    assert "first_traceback=w.log: ValueError: bad block" in text
    assert report.render(r).splitlines()[-1].startswith("== ferry soak: broken: requests_hung=3")


def test_no_success_at_all_is_broken():
    t = report.Tally()
    t.record("embed.client", 0, {"ev": "final", "c": {"issued": 3, "failed": 3}})
    assert _summary(t)["broken"] == ["requests_succeeded=0"]
