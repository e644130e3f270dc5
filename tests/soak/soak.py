#!/usr/bin/env python3
"""ferry's chaos soak: engines in several processes and two network namespaces under a mixed
workload, with faults injected at random; invariants checked at the end (docs/soak.md).

    sudo PYTHONPATH=build/release/python python3 tests/soak/soak.py --duration 60 [--seed N]

Roles (worker_*.py beside this file; "k" marks those the injector may kill -9 and restart):
  kvw: KV connector, write mode over ucx, producer(k) in namespace A -> consumer in B
  kvr: KV connector, read mode over shm, producer -> consumer(k), both in A
  batch: write_batch + notifications over ucx, sender in A -> receiver(k) in B, acks back
  embed: `ferry embed-serve`(k) in CPU mode and a client stepping it
Faults: kill -9 + restart, SIGSTOP/SIGCONT, the veth pair's link down/up, netem delay and loss
(skipped, saying why, where the kernel has no netem), a slow link (tbf). Exit status 0 only when every
invariant holds; 77 when it cannot run here (not root, no namespaces).
"""

import argparse
import ctypes
import glob
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from common import resources
from report import Tally, render

HERE = os.path.dirname(os.path.abspath(__file__))
IP_A, IP_B = "10.231.0.1", "10.231.0.2"
STALL_S = 30.0        # a worker that reports nothing this long while running is stuck
DRAIN_S = 75.0        # every request must end within this after issuing stops
FD_MARGIN = 16        # descriptors the long-lived processes may gain over the run
RSS_MARGIN = (1.25, 32 << 10)  # resident KiB at the end <= first * 1.25 + 32 MiB


def die_with_parent() -> None:
    """In a child: SIGKILL when the driver dies, even by kill -9 (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def remove_stale_namespaces() -> None:
    """Namespaces of earlier soaks whose driver is gone (killed with -9: no cleanup ran)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in set(re.findall(r"^fsoak(\d+)[ab]\b", out, re.M)):
        if not os.path.exists(f"/proc/{name}"):
            for side in "ab":
                sh(f"ip netns del fsoak{name}{side}")
            print(f"soak: removed the namespaces of an earlier run (pid {name}, gone)")
    for d in glob.glob(os.path.join(tempfile.gettempdir(), "ferry-soak-*-*")):
        pid = os.path.basename(d).split("-")[2]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and not os.path.exists(os.path.join(d, "keep")):
            shutil.rmtree(d, ignore_errors=True)


def sh(cmd: str) -> int:
    return subprocess.call(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Proc:
    """One role: its command, namespace, whether it may be killed, its current process."""

    def __init__(self, name, argv, ns, killable, reports=True):
        self.name, self.argv, self.ns, self.killable, self.reports = name, argv, ns, killable, reports
        self.p, self.inc, self.stopped, self.quiet_until = None, -1, False, 0.0
        self.last_tick, self.started = None, 0.0
        self.killed_by_us = set()  # pids
        self.restart_at = None


class Soak:
    def __init__(self, a):
        self.a, self.rng = a, random.Random(a.seed)
        self.run_id = str(os.getpid())
        self.ns = (f"fsoak{self.run_id}a", f"fsoak{self.run_id}b")
        self.veth = (f"fs{self.run_id}a", f"fs{self.run_id}b")
        self.rundir = tempfile.mkdtemp(prefix=f"ferry-soak-{self.run_id}-")
        self.events = queue.Queue()
        self.tally = Tally()
        self.procs = []
        self.netns_up = False
        self.netem_reason = None
        self.shape_ok = False
        self.timers = []  # (at, what, arg)
        self.link_busy = self.netem_busy = False

    # ---- the two hosts ----------------------------------------------------------------------

    def setup_net(self) -> str:
        a, b = self.ns
        va, vb = self.veth
        ok = (sh(f"ip netns add {a}") == 0 and sh(f"ip netns add {b}") == 0)
        self.netns_up = True
        ok = ok and all(sh(c) == 0 for c in (
            f"ip link add {va} type veth peer name {vb}", f"ip link set {va} netns {a}",
            f"ip link set {vb} netns {b}", f"ip -n {a} addr add {IP_A}/24 dev {va}",
            f"ip -n {b} addr add {IP_B}/24 dev {vb}", f"ip -n {a} link set {va} up",
            f"ip -n {b} link set {vb} up", f"ip -n {a} link set lo up", f"ip -n {b} link set lo up"))
        if not ok:
            return "cannot create network namespaces and a veth pair here (ip netns / ip link failed)"
        r = subprocess.run(f"tc -n {a} qdisc add dev {va} root netem delay 5ms loss 1%", shell=True,
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.netem_reason = f"no netem here (tc: {r.stderr.strip() or r.returncode})"
        else:
            sh(f"tc -n {a} qdisc del dev {va} root")
        # A token bucket that slows the link: queueing delay, and drops past its latency bound.
        self.shape_ok = sh(f"tc -n {a} qdisc add dev {va} root tbf rate 10mbit burst 32kbit latency 50ms") == 0
        sh(f"tc -n {a} qdisc del dev {va} root")
        return ""

    def cleanup(self) -> None:
        for pr in self.procs:
            if pr.p is not None and pr.p.poll() is None:
                try:
                    os.kill(pr.p.pid, signal.SIGCONT)
                    pr.p.kill()
                    pr.p.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        if self.netns_up:
            for n in self.ns:
                sh(f"ip netns del {n}")  # takes its end of the veth pair with it
            sh(f"ip link del {self.veth[0]}")
            self.netns_up = False
        if self.a.keep_logs:
            open(os.path.join(self.rundir, "keep"), "w").close()
            print(f"soak: logs kept in {self.rundir}")
        else:
            shutil.rmtree(self.rundir, ignore_errors=True)

    # ---- processes --------------------------------------------------------------------------

    def roles(self, ferry_bin: str):
        py, a, b = sys.executable, self.ns[0], self.ns[1]
        common = ["--rundir", self.rundir, "--run", self.run_id, "--seed", str(self.a.seed)]
        kv = [py, os.path.join(HERE, "worker_kv.py"), *common, "--rate", str(self.a.rate)]
        bt = [py, os.path.join(HERE, "worker_batch.py"), *common, "--rate", str(self.a.rate)]
        sys.path.insert(0, HERE)
        from worker_embed import EMBED_ARGS
        sock = os.path.join(self.rundir, "embed.sock")
        return [
            Proc("kvw.producer", kv + ["--pair", "kvw", "--role", "producer", "--mode", "write",
                                       "--transport", "ucx", "--listen", IP_A], a, True),
            Proc("kvw.consumer", kv + ["--pair", "kvw", "--role", "consumer", "--mode", "write",
                                       "--transport", "ucx", "--listen", IP_B], b, False),
            Proc("kvr.producer", kv + ["--pair", "kvr", "--role", "producer", "--mode", "read",
                                       "--transport", "shm"], a, False),
            Proc("kvr.consumer", kv + ["--pair", "kvr", "--role", "consumer", "--mode", "read",
                                       "--transport", "shm"], a, True),
            Proc("batch.sender", bt + ["--pair", "batch", "--role", "sender", "--listen", IP_A], a, False),
            Proc("batch.receiver", bt + ["--pair", "batch", "--role", "receiver", "--listen", IP_B], b, True),
            Proc("embed.serve", [ferry_bin, "embed-serve", "--socket", sock, *EMBED_ARGS], b, True,
                 reports=False),
            Proc("embed.client", [py, os.path.join(HERE, "worker_embed.py"), "--socket", sock, "--seed",
                                  str(self.a.seed), "--rate", str(self.a.rate / 4)], a, False),
        ]

    def start(self, pr: Proc) -> None:
        pr.inc += 1
        argv = list(pr.argv)
        if pr.reports:
            argv += ["--inc", str(pr.inc)]
        else:
            try:
                os.unlink(argv[argv.index("--socket") + 1])  # a killed service leaves its socket
            except OSError:
                pass
        err = open(os.path.join(self.rundir, pr.name + ".log"), "ab")
        pr.p = subprocess.Popen(["ip", "netns", "exec", pr.ns, *argv], stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, env=self.env,
                                preexec_fn=die_with_parent)
        err.close()
        pr.started, pr.last_tick, pr.stopped, pr.restart_at = time.monotonic(), None, False, None
        threading.Thread(target=self.read, args=(pr, pr.p, pr.inc), daemon=True).start()

    def read(self, pr: Proc, p, inc: int) -> None:
        for line in p.stdout:
            if pr.reports:
                try:
                    self.events.put((pr, inc, json.loads(line)))
                except ValueError:
                    pass
        p.stdout.close()

    def pump(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while True:
            try:
                pr, inc, ev = self.events.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return
            if inc == pr.inc:
                pr.last_tick = time.monotonic()
            self.tally.record(pr.name, inc, ev)

    # ---- faults -----------------------------------------------------------------------------

    def alive(self, pr: Proc) -> bool:
        return pr.p is not None and pr.p.poll() is None

    def inject(self) -> None:
        kinds = ["kill", "stop", "link"] + ([] if self.netem_reason else ["netem"]) + \
            (["slow"] if self.shape_ok else [])
        kind = self.rng.choice(kinds)
        now = time.monotonic()
        if kind == "kill":
            cands = [p for p in self.procs if p.killable and self.alive(p) and not p.stopped]
            if not cands:
                return
            pr = self.rng.choice(cands)
            pr.killed_by_us.add(pr.p.pid)
            pr.p.kill()
            pr.restart_at = now + self.rng.uniform(0.3, 2.0)
        elif kind == "stop":
            cands = [p for p in self.procs if self.alive(p) and not p.stopped]
            if not cands:
                return
            pr = self.rng.choice(cands)
            os.kill(pr.p.pid, signal.SIGSTOP)
            pr.stopped = True
            self.timers.append((now + self.rng.uniform(0.2, 3.0), "cont", pr))
        elif kind == "link":
            if self.link_busy:
                return
            self.link_busy = True
            sh(f"ip -n {self.ns[0]} link set {self.veth[0]} down")
            self.timers.append((now + self.rng.uniform(0.5, 4.0), "up", None))
        else:  # netem or slow: one qdisc on both ends of the veth pair at a time
            if self.netem_busy:
                return
            self.netem_busy = True
            if kind == "netem":
                delay, loss = self.rng.choice([1, 5, 20]), self.rng.choice([0.5, 1, 5])
                qdisc = f"netem delay {delay}ms loss {loss}%"
            else:
                rate, latency = self.rng.choice([1, 5, 20]), self.rng.choice([20, 100, 400])
                qdisc = f"tbf rate {rate}mbit burst 32kbit latency {latency}ms"
            for n, v in zip(self.ns, self.veth):
                sh(f"tc -n {n} qdisc add dev {v} root {qdisc}")
            self.timers.append((now + self.rng.uniform(2.0, 8.0), "netem_off", None))
        self.tally.faults[kind] = self.tally.faults.get(kind, 0) + 1

    def due(self, everything: bool = False) -> None:
        now = time.monotonic()
        keep = []
        for at, what, arg in self.timers:
            if at > now and not everything:
                keep.append((at, what, arg))
            elif what == "cont":
                if self.alive(arg):
                    os.kill(arg.p.pid, signal.SIGCONT)
                arg.stopped, arg.quiet_until = False, now + 5.0
            elif what == "up":
                sh(f"ip -n {self.ns[0]} link set {self.veth[0]} up")
                self.link_busy = False
            elif what == "netem_off":
                for n, v in zip(self.ns, self.veth):
                    sh(f"tc -n {n} qdisc del dev {v} root")
                self.netem_busy = False
        self.timers = keep
        for pr in self.procs:
            if pr.restart_at is not None and (everything or pr.restart_at <= now):
                self.start(pr)

    def watch(self) -> None:
        """Processes that exited on their own, and workers that stopped reporting."""
        now = time.monotonic()
        for pr in self.procs:
            if pr.p is None or pr.restart_at is not None:
                continue
            rc = pr.p.poll()
            if rc is not None:
                if pr.p.pid not in pr.killed_by_us:
                    with open(os.path.join(self.rundir, pr.name + ".log"), errors="replace") as f:
                        tail = [l.strip() for l in f.readlines()[-40:] if l.strip()]
                    telling = [l for l in tail if any(w in l for w in ("Assertion", "Error", "Fatal", "rror:"))]
                    last = (telling or tail)[-1:]
                    self.tally.crash(pr.name, pr.inc, rc, last[0] if last else "", tail)
                    pr.restart_at = now + 0.5
                continue
            if not pr.reports or pr.stopped or now < pr.quiet_until:
                continue
            last = pr.last_tick or pr.started
            grace = STALL_S if pr.last_tick else 2 * STALL_S  # start-up imports numpy and ferry
            if now - last > grace:
                self.tally.stall(pr.name, pr.inc, now - last)
                pr.quiet_until = now + STALL_S  # count it once a window

    def sample(self, label: str) -> None:
        """Descriptors and memory of the long-lived processes; "first" once a process has
        reported (its imports done), "end" when the injector stops."""
        for pr in self.procs:
            if label == "first" and (pr.last_tick is None or label in self.tally.resources.get(pr.name, {})):
                continue
            if not pr.killable and self.alive(pr):
                r = resources(pr.p.pid)
                if r:
                    self.tally.resources.setdefault(pr.name, {})[label] = {"fds": r[0], "rss_kib": r[1],
                                                                           "pid": pr.p.pid}

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        a = self.a
        build = a.build
        ferry_bin = os.path.join(build, "tools", "ferry")
        pypath = os.path.join(build, "python")
        if not os.path.exists(ferry_bin) or not os.path.isdir(pypath):
            print(f"soak: no build at {build} (tools/ferry and python/): build _ferry and ferry first")
            return 2
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([pypath, HERE]), PYTHONUNBUFFERED="1")
        remove_stale_namespaces()
        why = self.setup_net()
        if why:
            print(f"soak: skipped: {why}")
            return 77
        print(f"soak: seed {a.seed}, {a.duration:.0f} s, namespaces {self.ns[0]} {self.ns[1]}, logs {self.rundir}")
        print(f"soak: netem: {self.netem_reason or 'on (delay and loss on the veth pair)'}; slow link (tbf): "
              f"{'on' if self.shape_ok else 'not available here'}")
        self.procs = self.roles(ferry_bin)
        for pr in self.procs:
            self.start(pr)
        t0 = time.monotonic()
        first_at = t0 + min(60.0, 0.2 * a.duration)
        next_fault = t0 + 5.0  # let everyone meet first
        next_progress = t0 + 60.0
        while time.monotonic() - t0 < a.duration:
            self.pump(0.1)
            self.due()
            self.watch()
            if time.monotonic() >= first_at:
                self.sample("first")
            if time.monotonic() >= next_progress:
                print(f"soak: {time.monotonic() - t0:.0f} s: {self.tally.progress()}", flush=True)
                next_progress += 60.0
            if time.monotonic() >= next_fault:
                self.inject()
                next_fault = time.monotonic() + self.rng.uniform(0.3, 2.0 * a.fault_interval)
        self.due(everything=True)  # SIGCONT, link up, netem off, restarts
        self.sample("end")
        print("soak: faults off; letting workers meet again, then draining")
        settle = time.monotonic() + 5.0
        while time.monotonic() < settle:
            self.pump(0.1)
            self.watch()
        return self.drain()

    def drain(self) -> int:
        workers = [p for p in self.procs if p.reports]
        for pr in workers:
            if self.alive(pr):
                os.kill(pr.p.pid, signal.SIGUSR1)
        start = time.monotonic()
        while time.monotonic() - start < DRAIN_S:
            self.pump(0.2)
            self.watch()
            if time.monotonic() - start > 2.5 and self.tally.all_drained(
                    [(p.name, p.inc) for p in workers], since=start):
                break
        self.tally.drain_s = time.monotonic() - start
        for pr in workers:
            if self.alive(pr):
                os.kill(pr.p.pid, signal.SIGTERM)
        end = time.monotonic() + 30
        for pr in self.procs:
            if not pr.reports and self.alive(pr):
                pr.p.terminate()
            try:
                pr.p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.tally.no_exit.append(pr.name)
        self.pump(1.0)
        for pr in workers:
            self.tally.expect_final(pr.name, pr.inc)
        self.tally.scan_logs(self.rundir)
        report = self.tally.summary(FD_MARGIN, RSS_MARGIN, self.netem_reason)
        report.update(seed=self.a.seed, duration_s=self.a.duration)
        print(render(report))
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump(report, f, indent=1)
        return 0 if report["ok"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults (then a drain)")
    p.add_argument("--seed", type=int, default=None, help="the injector's seed (default: random, printed)")
    p.add_argument("--build", default=None, help="build tree with python/ and tools/ferry "
                   "(default: the one the ferry module on PYTHONPATH came from, else build/release)")
    p.add_argument("--rate", type=float, default=20.0, help="requests a second per initiating worker")
    p.add_argument("--fault-interval", type=float, default=1.0, help="mean seconds between faults")
    p.add_argument("--json", help="write the figures here as JSON")
    p.add_argument("--keep-logs", action="store_true", help="keep the workers' logs")
    a = p.parse_args()
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    if a.build is None:
        a.build = next((os.path.dirname(x) for x in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                        if x and os.path.exists(os.path.join(x, "ferry"))),
                       os.path.join(HERE, "..", "..", "build", "release"))
    a.build = os.path.abspath(a.build)
    if os.geteuid() != 0:
        print("soak: skipped: needs root (network namespaces, veth, tc)")
        return 77
    soak = Soak(a)

    def stop(signum, _):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        return soak.run()
    finally:
        soak.cleanup()


if __name__ == "__main__":
    sys.exit(main())
