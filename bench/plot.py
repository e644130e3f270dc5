#!/usr/bin/env python3
"""Draws a `ferry bench` sweep: GB/s against piece size, one line per run and batch size.

Inputs are `ferry bench --json FILE` outputs, or a results table (bench/results/*.md) whose
`$ ferry bench ...` blocks hold the tool's printed tables; each run is one colour, each batch
size one marker. A baseline is drawn beside the runs when the input carries one (`ferry bench
--json` measures one for host memory in the same run: its "baseline" list of {"piece_bytes",
"batch", "gbps"}, one thread's memcpy of each point's pieces; or --baseline GBPS:LABEL for a
figure of the same run quoted in the table's text); otherwise the picture says that there is
none.

    python3 bench/plot.py run.json [more.json ...] --out sweep.png [--title T]
    python3 bench/plot.py bench/results/cli_h200.md --out bench/results/cli_h200.png

Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""

import argparse
import json
import re
import sys

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_bytes(text):
    """'64 KiB' or '4K' or '4096' as bytes."""
    m = re.match(r"^([\d.]+)\s*(B|KiB|MiB|GiB|K|M|G)?$", text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    unit = m.group(2) or "B"
    unit = {"K": "KiB", "M": "MiB", "G": "GiB"}.get(unit, unit)
    return int(float(m.group(1)) * UNITS[unit])


def runs_from_json(path):
    with open(path) as f:
        d = json.load(f)
    points = [(p["piece_bytes"], p["batch"], p["gbps"]) for p in d.get("points", [])]
    op = d["points"][0]["op"] if d.get("points") else "?"
    # ferry bench's own: one baseline point per (piece, batch), measured in the same run.
    baseline = [(p["piece_bytes"], p.get("batch", 0), p["gbps"]) for p in d.get("baseline", [])]
    return [{"label": f"{op}, {d.get('link', path)}", "points": points, "baseline": baseline,
             "baseline_what": d.get("baseline_what", "baseline")}]


def runs_from_md(path):
    """The tables that `ferry bench` printed inside a results file's `$ ferry bench` blocks."""
    runs, run = [], None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("ferry bench: "):
            run = {"label": line[len("ferry bench: "):], "points": [], "baseline": []}
            runs.append(run)
            continue
        if run is None:
            continue
        m = re.match(r"^\s*([\d.]+ (?:B|KiB|MiB|GiB))\s+(\d+)\s+[\d.]+ (?:B|KiB|MiB|GiB)\s+\d+\s+([\d.]+)\s", line)
        if m:
            run["points"].append((size_bytes(m.group(1)), int(m.group(2)), float(m.group(3))))
        elif line.startswith("$") or line.startswith("```"):
            run = None
    return [r for r in runs if r["points"]]


def human(n):
    for unit in ("GiB", "MiB", "KiB"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]} {unit}"
    return f"{n} B"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="ferry bench --json files or a bench/results/*.md")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default=None)
    ap.add_argument("--baseline", action="append", default=[], metavar="GBPS:LABEL",
                    help="a flat baseline of the same run, e.g. 29.5:'memcpy, 1 thread'")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench/plot.py needs matplotlib: apt-get install python3-matplotlib "
              "(or pip install matplotlib)", file=sys.stderr)
        return 2

    runs = []
    for path in args.inputs:
        runs += runs_from_md(path) if path.endswith(".md") else runs_from_json(path)
    if not runs:
        print(f"no ferry bench results in {', '.join(args.inputs)}", file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=80)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "os^Dvx*"
    batches = sorted({b for r in runs for _, b, _ in r["points"]})
    sizes = sorted({s for r in runs for s, _, _ in r["points"]})
    has_baseline = False
    for i, run in enumerate(runs):
        colour = colours[i % len(colours)]
        for batch in sorted({b for _, b, _ in run["points"]}):
            pts = sorted((s, g) for s, b, g in run["points"] if b == batch)
            ax.plot([s for s, _ in pts], [g for _, g in pts], color=colour,
                    marker=markers[batches.index(batch) % len(markers)], markersize=4, linewidth=1.2,
                    label=f"{run['label']}, batch {batch}")
        for batch in sorted({b for _, b, _ in run["baseline"]}):
            has_baseline = True
            pts = sorted((s, g) for s, b, g in run["baseline"] if b == batch)
            ax.plot([s for s, _ in pts], [g for _, g in pts], color=colour, linestyle="--",
                    marker=markers[batches.index(batch) % len(markers)] if batch in batches else None,
                    markersize=3, markerfacecolor="none", linewidth=1,
                    label=f"{run.get('baseline_what', 'baseline')}, batch {batch}")
    for spec in args.baseline:
        gbps, _, label = spec.partition(":")
        ax.axhline(float(gbps), color="grey", linestyle="--", linewidth=1, label=label or "baseline")
        has_baseline = True
    if not has_baseline:
        ax.text(0.99, 0.01, "no baseline: this run measured ferry only", transform=ax.transAxes,
                fontsize=7, ha="right", va="bottom", color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(s) for s in sizes], rotation=45, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("piece size")
    ax.set_ylabel("GB/s (10^9 bytes/s)")
    ax.grid(True, linewidth=0.3)
    ax.set_title(args.title or ", ".join(args.inputs), fontsize=9)
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
