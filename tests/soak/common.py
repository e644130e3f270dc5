"""What the soak's workers share: counters reported as JSON lines, the rendezvous files through
which a restarted peer is found again, a pool of blocks that catches double frees, and the
deterministic data a receiver checks byte for byte.

A worker prints one JSON object a line on stdout: {"ev": "tick", ...} every second (from a
thread of its own, so a worker blocked in a ferry call still reports), {"ev": "final", ...}
when it exits after a drain. The driver (soak.py) reads them.
"""

import hashlib
import json
import os
import signal
import sys
import threading
import time

import numpy as np


def now_ms() -> float:
    return time.monotonic() * 1000.0


def seed_of(*parts) -> int:
    """A 64-bit seed from strings and numbers (stable across processes, unlike hash())."""
    h = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def pattern(nbytes: int, *parts) -> np.ndarray:
    """nbytes of data determined by `parts` (a request id, a layer...)."""
    return np.random.default_rng(seed_of(*parts)).integers(0, 256, nbytes, dtype=np.uint8)


class Reporter:
    """Counters and the requests outstanding, printed as a tick every second.

    A request is outstanding from start() to end(); one older than its deadline plus the
    margin is reported as overdue (the driver counts it hung). end() of a request that is not
    outstanding counts an end seen twice (or never begun): a broken "ends exactly once".
    """

    def __init__(self, role: str, incarnation: int, deadline_ms: float, margin_ms: float):
        self.role, self.incarnation = role, incarnation
        self.deadline_ms, self.margin_ms = deadline_ms, margin_ms
        self.mu = threading.Lock()
        self.c = {"issued": 0, "ok": 0, "failed": 0, "verified_bytes": 0, "corrupt_bytes": 0,
                  "ended_twice": 0, "double_free": 0, "errors_raised": 0}
        self.codes = {}
        self.open = {}  # request -> start (ms)
        self.draining = False
        self.extra = {}
        self._stop = threading.Event()
        self._out = threading.Lock()

    def count(self, key: str, n: int = 1) -> None:
        with self.mu:
            self.c[key] = self.c.get(key, 0) + n

    def start(self, request: str, issued: bool = True) -> None:
        with self.mu:
            self.open[request] = now_ms()
            if issued:
                self.c["issued"] += 1

    def end(self, request: str, code: str) -> bool:
        """Ends `request` with `code` ("OK" or an error's); False if it was not outstanding."""
        with self.mu:
            if self.open.pop(request, None) is None:
                self.c["ended_twice"] += 1
                return False
            if code == "OK":
                self.c["ok"] += 1
            else:
                self.c["failed"] += 1
                self.codes[code] = self.codes.get(code, 0) + 1
            return True

    def is_open(self, request: str) -> bool:
        with self.mu:
            return request in self.open

    def snapshot(self) -> dict:
        with self.mu:
            t = now_ms()
            oldest = min(self.open.values(), default=t)
            overdue = [r for r, s in self.open.items() if t - s > self.deadline_ms + self.margin_ms]
            return {"role": self.role, "inc": self.incarnation, "pid": os.getpid(), "c": dict(self.c),
                    "codes": dict(self.codes), "outstanding": len(self.open), "oldest_ms": t - oldest,
                    "overdue": overdue[:5], "n_overdue": len(overdue), "draining": self.draining,
                    **self.extra}

    def emit(self, ev: str, **fields) -> None:
        line = json.dumps({"ev": ev, "t": time.time(), **self.snapshot(), **fields})
        with self._out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def run_ticks(self) -> None:
        def loop():
            while not self._stop.wait(1.0):
                self.emit("tick")
        threading.Thread(target=loop, daemon=True).start()

    def stop_ticks(self) -> None:
        self._stop.set()


class Signals:
    """SIGUSR1: stop issuing (drain); SIGTERM: finish, report and exit."""

    def __init__(self, rep: Reporter):
        self.rep, self.quit = rep, False
        signal.signal(signal.SIGUSR1, self._drain)
        signal.signal(signal.SIGTERM, self._quit)

    def _drain(self, *_):
        self.rep.draining = True

    def _quit(self, *_):
        self.rep.draining = True
        self.quit = True


class BlockPool:
    """Block ids handed out and back; a block freed while free counts as a double free."""

    def __init__(self, n: int, rep: Reporter):
        self.n, self.rep = n, rep
        self.free = list(range(n))
        self.is_free = [True] * n

    def take(self, k: int):
        if len(self.free) < k:
            return None
        got = [self.free.pop() for _ in range(k)]
        for b in got:
            self.is_free[b] = False
        return got

    def give(self, blocks) -> None:
        for b in blocks:
            if not 0 <= b < self.n or self.is_free[b]:
                self.rep.count("double_free")
                continue
            self.is_free[b] = True
            self.free.append(b)

    def leaked(self) -> int:
        return self.n - len(self.free)


def make_engine(rep: Reporter, **options):
    """ferry.Engine(**options), retried while it answers UNAVAILABLE (for up to 30 s).

    UCX finds no network device in a namespace whose only link is down ("ucp_worker_create:
    No such device"): a worker restarted during a link fault waits for the link, as a
    supervisor restarting it would, and counts the attempts (engine_retries)."""
    import ferry

    deadline = time.monotonic() + 30.0
    while True:
        try:
            return ferry.Engine(**options)
        except ferry.Error as e:
            if e.code != "UNAVAILABLE" or time.monotonic() > deadline:
                raise
            rep.count("engine_retries")
            sys.stderr.write(f"soak: engine not created yet ({e.message}); retrying\n")
            time.sleep(0.5)


def publish(rundir: str, name: str, record: dict) -> None:
    """Writes <rundir>/<name>.json atomically: what a peer needs to reach this incarnation."""
    path = os.path.join(rundir, name + ".json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


class Watch:
    """Follows <rundir>/<name>.json: changed() returns a new record once per incarnation."""

    def __init__(self, rundir: str, name: str):
        self.path = os.path.join(rundir, name + ".json")
        self.stamp = None

    def changed(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self.stamp:
            return None
        with open(self.path) as f:
            record = json.load(f)
        self.stamp = stamp
        return record


def resources(pid: int):
    """(open descriptors, resident KiB) of a process, or None once it is gone."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        return fds, rss
    except (OSError, StopIteration, ValueError):
        return None
