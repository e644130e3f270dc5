#!/usr/bin/env python3
"""Turns ferry_bench_transfer's JSON (--benchmark_out=FILE --benchmark_out_format=json) into the
markdown tables of bench/results/transfer_host.md: GB/s of each way of writing 256 MiB, the
ratios to the memcpy loop against their targets, and the per-op cost of posting a batch.
With --benchmark_repetitions=N, the median of the repetitions is used.
Usage: bench/summarize.py FILE.json
"""
import json
import sys


def load(path):
    with open(path) as f:
        doc = json.load(f)
    rows = {}
    for b in doc["benchmarks"]:
        name = b["run_name"] if "run_name" in b else b["name"]
        name = name.split("/min_time")[0]
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                rows[name] = b
        elif name not in rows or rows[name].get("run_type") != "aggregate":
            rows.setdefault(name, b)
    return doc["context"], rows


def main():
    context, rows = load(sys.argv[1])
    sizes = ["4KiB", "64KiB", "1MiB"]
    out = []
    out.append("| piece | memcpy loop GB/s | ferry GB/s | ferry 1 thread GB/s | ferry / memcpy | "
               "1 thread / memcpy | target (ferry / memcpy) |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for size in sizes:
        def gbps(kind):
            b = rows.get(f"host_write/{kind}/{size}")
            return b["bytes_per_second"] / 1e9 if b else float("nan")
        m, f, f1 = gbps("memcpy_loop"), gbps("ferry"), gbps("ferry_1thread")
        target = 1.3 if size == "1MiB" else 0.8
        verdict = "met" if f / m >= target else "MISSED"
        out.append(f"| {size} | {m:.2f} | {f:.2f} | {f1:.2f} | {f / m:.2f}x | {f1 / m:.2f}x | "
                   f">= {target}x: {verdict} |")
    out.append("")
    out.append("| batch of 100,000 ops | CPU ns per op | real ns per op | target |")
    out.append("| --- | ---: | ---: | --- |")
    for name in ["post_batch/100000x8B", "post_batch/100000x16B",
                 "validate_batch/100000_out_of_range"]:
        b = rows.get(name)
        if not b:
            continue
        scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
        cpu = b["cpu_time"] * scale / 100000
        real = b["real_time"] * scale / 100000
        verdict = "met" if cpu <= 100 else "MISSED"
        out.append(f"| {name} | {cpu:.1f} | {real:.1f} | <= 100 ns: {verdict} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
