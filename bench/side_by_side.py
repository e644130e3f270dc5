#!/usr/bin/env python3
"""Turns the results of bench/side_by_side.sh into one markdown table.

For each figure both builds measured: the old and the new value (median over the rounds, with
the range), new / old, and where the program has an in-run baseline (the memcpy loop of
ferry_bench_transfer, the 1 GiB copies of ferry_bench_cuda) each build's ratio to it, which is
what bench/results/ reports and what the comparison is about: a ratio that drops more than the
spread of its rounds is a regression.
Usage: bench/side_by_side.py OUT_DIR
"""
import glob
import json
import os
import re
import statistics
import sys


def figure(b):
    """(value, unit, higher_is_better) of one google-benchmark entry."""
    if "bytes_per_second" in b:
        return b["bytes_per_second"] / 1e9, "GB/s", True
    for key in ("GiB_s", "GB_s", "gbps"):
        if key in b:
            return float(b[key]), key.replace("_", "/"), True
    unit = b.get("time_unit", "ns")
    return b["real_time"], unit, False


def load(out):
    """{(side, name): [values...]} and {name: (unit, higher_is_better)}."""
    values, units = {}, {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        side, rest = os.path.basename(path).split(".", 1)
        if side not in ("old", "new"):
            continue
        with open(path) as f:
            doc = json.load(f)
        if "benchmarks" in doc:  # google-benchmark
            prog = rest.split(".")[0]
            for b in doc["benchmarks"]:
                if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                    continue
                name = prog + ":" + b["name"].split("/min_time")[0]
                v, unit, hib = figure(b)
                values.setdefault((side, name), []).append(v)
                units[name] = (unit, hib)
        elif "points" in doc:  # ferry bench --json
            name = "ferry bench:" + rest.rsplit(".", 2)[0]
            for p in doc["points"]:
                values.setdefault((side, name), []).append(p["gbps"])
                units[name] = ("GB/s", True)
    return values, units


BASELINES = [  # (program prefix, pattern of a figure, its baseline's name)
    (re.compile(r"^ferry_bench_transfer:host_write/[^/]+/(\w+)$"),
     lambda m: f"ferry_bench_transfer:host_write/memcpy_loop/{m.group(1)}"),
    (re.compile(r"^ferry_bench_cuda:kv_gpu_to_host/.*$"), lambda m: "ferry_bench_cuda:pinned_1GiB"),
    (re.compile(r"^ferry_bench_cuda:kv_cuda_ipc.*$"), lambda m: "ferry_bench_cuda:d2d_1GiB"),
]


def baseline_of(name, names):
    for pattern, base in BASELINES:
        m = pattern.match(name)
        if m:
            b = base(m)
            for n in names:
                if n == b or n.startswith(b + "/"):
                    return n if n != name else None
    return None


def fmt(xs):
    if not xs:
        return "-"
    med = statistics.median(xs)
    return f"{med:.3g} ({min(xs):.3g}-{max(xs):.3g})" if len(xs) > 1 else f"{med:.3g}"


def main():
    out = sys.argv[1]
    values, units = load(out)
    names = sorted(units)
    print("| figure | unit | old (range) | new (range) | new / old | old vs baseline | "
          "new vs baseline |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        o, n = values.get(("old", name), []), values.get(("new", name), [])
        if not o or not n:
            continue
        unit, hib = units[name]
        ratio = statistics.median(n) / statistics.median(o)
        if not hib:
            ratio = 1 / ratio  # > 1 is better either way
        base = baseline_of(name, names)
        rel = ["-", "-"]
        if base:
            for i, side in enumerate(("old", "new")):
                bv = values.get((side, base), [])
                mine = values.get((side, name), [])
                if bv and mine:
                    r = statistics.median(mine) / statistics.median(bv)
                    rel[i] = f"{r if units[base][1] else 1 / r:.3f}"
        print(f"| {name} | {unit}{'' if hib else ' (lower is better)'} | {fmt(o)} | {fmt(n)} | "
              f"{ratio:.3f} | {rel[0]} | {rel[1]} |")
    print("\nnew / old: above 1 the new build is faster (for times, the inverse ratio).")


if __name__ == "__main__":
    main()
