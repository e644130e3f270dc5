#!/usr/bin/env python3
"""Counts what a ctest run of ferry ran, from the reports it left (scripts/test calls it).

Usage: test_summary.py LABEL RESULTS_DIR
  RESULTS_DIR/ctest.xml       ctest --output-junit (one entry per test binary or script)
  RESULTS_DIR/gtest/*.xml     GoogleTest's reports (GTEST_OUTPUT=xml:RESULTS_DIR/gtest/)
  RESULTS_DIR/python_tests.xml  pytest's --junitxml (python/CMakeLists.txt)

Prints "C++: N cases, P passed, S skipped, F failed", the same for Python and for the ctest
entries that are scripts, then every skipped case with its reason. A missing or unreadable
report is a note on the output, never an error: the exit status is always 0, and the caller
keeps deciding pass or fail from ctest's own status.
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET


class Counts:
    def __init__(self):
        self.total = self.passed = self.skipped = self.failed = 0
        self.skips = []  # (case, reason)

    def line(self, what):
        return (f"{what}: {self.total} cases, {self.passed} passed, {self.skipped} skipped, "
                f"{self.failed} failed")


def parse(path, notes):
    try:
        return ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        notes.append(f"cannot read {path}: {e}")
        return None


def one_line(text):
    return " ".join((text or "").split())


def add_case(counts, name, case):
    """Adds one JUnit-style <testcase> (GoogleTest's and pytest's share the shape)."""
    skipped = case.find("skipped")
    failed = case.find("failure") is not None or case.find("error") is not None
    counts.total += 1
    if failed:
        counts.failed += 1
    elif skipped is not None or case.get("result") == "skipped" or case.get("status") == "notrun":
        counts.skipped += 1
        reason = skipped.get("message", "") if skipped is not None else "disabled"
        # GoogleTest's message starts with "file:line" on a line of its own.
        lines = [l for l in reason.splitlines() if l.strip()]
        if len(lines) > 1 and ":" in lines[0] and lines[0].rsplit(":", 1)[-1].isdigit():
            lines = lines[1:]
        counts.skips.append((name, one_line(" ".join(lines)) or "no reason given"))
    else:
        counts.passed += 1


def gtest(results, notes):
    counts = Counts()
    binaries = set()
    for path in sorted(glob.glob(os.path.join(results, "gtest", "*.xml"))):
        root = parse(path, notes)
        if root is None:
            continue
        binary = os.path.basename(path)[:-4]
        binaries.add(binary)
        for case in root.iter("testcase"):
            add_case(counts, f"{binary}: {case.get('classname')}.{case.get('name')}", case)
    return counts, binaries


def pytest(results, notes):
    counts = Counts()
    path = os.path.join(results, "python_tests.xml")
    if not os.path.exists(path):
        return None
    root = parse(path, notes)
    if root is None:
        return None
    for case in root.iter("testcase"):
        add_case(counts, f"python: {case.get('classname')}::{case.get('name')}", case)
    return counts


def ctest(results, notes, gtest_binaries):
    """The entries that are neither a GoogleTest binary nor pytest: shell tests of the CLI. A
    GoogleTest binary that crashed before writing its report counts here (as failed)."""
    path = os.path.join(results, "ctest.xml")
    if not os.path.exists(path):
        notes.append(f"no {path}: ctest wrote no JUnit report")
        return None, set()
    root = parse(path, notes)
    if root is None:
        return None, set()
    counts = Counts()
    entries = set()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        entries.add(name)
        if name in gtest_binaries or name == "python_tests":
            continue
        status = case.get("status", "")
        counts.total += 1
        if status == "fail":
            counts.failed += 1
        elif status in ("notrun", "disabled") or case.find("skipped") is not None:
            counts.skipped += 1
            out = [l for l in (case.findtext("system-out") or "").splitlines() if l.strip()]
            counts.skips.append((name, one_line(out[-1]) if out else "no output"))
        else:
            counts.passed += 1
    return counts, entries


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2])
        return 0
    label, results = sys.argv[1], sys.argv[2]
    notes = []
    cpp, binaries = gtest(results, notes)
    scripts, entries = ctest(results, notes, binaries)
    py = pytest(results, notes)
    print(f"== ferry: what ran ({label})")
    print("  " + cpp.line("C++"))
    if py is not None:
        print("  " + py.line("Python"))
    elif "python_tests" in entries:
        notes.append("python_tests ran but left no pytest report")
    if scripts is not None and scripts.total:
        print("  " + scripts.line("scripts (ctest entries)"))
    skips = cpp.skips + (py.skips if py else []) + (scripts.skips if scripts else [])
    if skips:
        print(f"  skipped, and why ({len(skips)}):")
        for name, reason in skips:
            print(f"    {name}: {reason}")
    for note in notes:
        print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
