"""ferry.vllm.FerryConnector driven in vLLM's call order by two processes, a prefill and a
decode instance (vllm_standin.py), with this test as the router between them: write and read
mode, routers that send to P first or to both at once, every byte checked at the decode side,
and failed prefills (a killed process, an aborted request) reported for recompute."""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import ferry.vllm
from vllm_standin import N

HERE = os.path.dirname(os.path.abspath(__file__))
# Short timeouts so that a failure shows within seconds (vLLM's defaults are 30 s and more).
FAST = {"transfer_timeout_ms": 8000, "liveness_interval_ms": 200, "handshake_timeout_ms": 2000,
        "abort_timeout_ms": 10000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Instance:
    """A vllm_standin.py child: call(cmd) sends one command and returns its answer."""

    def __init__(self, name: str, mode: str, order: str, use_torch: bool = False, tp: int = 1):
        self.name, self.port = name, free_port()
        while tp > 1 and not port_free(self.port + 1):  # rank r serves on port + r
            self.port = free_port()
        cfg = {"name": name, "mode": mode, "port": self.port, "order": order, "extra": FAST, "torch": use_torch,
               "tp": tp}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "vllm_standin.py"), json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def wait_ready(self):
        ready = self._next(20)
        assert ready["ready"] and ready["address"] == f"127.0.0.1:{self.port}", ready

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.lines.put(line[2:])
            else:  # what a library printed
                sys.stderr.write(f"{self.name}: {line}")
        self.lines.put(None)

    def _next(self, timeout_s: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"{self.name}: no answer within {timeout_s} s")
        assert line is not None, f"{self.name} exited with {self.proc.poll()}"
        return json.loads(line)

    def call(self, cmd: str, timeout_s: float = 20, **args) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout_s)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def pd():
    made = []

    def make(mode: str, p_order: str = "blocks_first", d_order: str = "kv_first_hnd", use_torch: bool = False,
             p_tp: int = 1, d_tp: int = 1):
        p = Instance("prefill-0", mode, p_order, use_torch, p_tp)
        d = Instance("decode-0", mode, d_order, False, d_tp)  # torch on one side: it takes seconds to import
        p.wait_ready()  # both start at once (importing torch takes seconds on a busy machine)
        d.wait_ready()
        made.extend([p, d])
        return p, d

    yield make
    for inst in made:
        inst.close()


REQUESTS = [("r0", 40), ("r1", 16), ("r2", 100), ("r3", 1), ("r4", 63)]  # (id, prompt tokens)


# What vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) sends to P.
TO_P = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}


def prefill(p: Instance, reqs) -> dict:
    """The router's first leg: each prompt to P with max_tokens=1; P's kv_transfer_params back."""
    p.call("add", requests=[{"id": r, "len": n, "params": TO_P} for r, n in reqs])
    out = p.call("run", ids=[r for r, _ in reqs], until="result")
    assert out["pending"] == []
    return out["state"]["params"]


@pytest.mark.parametrize("mode,use_torch,p_tp,d_tp", [
    ("write", False, 1, 1), ("read", False, 1, 1), ("write", True, 1, 1),
    ("write", False, 2, 1), ("read", False, 1, 2),  # TP ranks: every rank's handshake port, heads split
])
def test_p_then_d_moves_every_byte_of_several_requests(pd, mode, use_torch, p_tp, d_tp):
    if use_torch:
        pytest.importorskip("torch")
    p, d = pd(mode, use_torch=use_torch, p_tp=p_tp, d_tp=d_tp)
    start = time.monotonic()
    params = prefill(p, REQUESTS)
    for r, n in REQUESTS:
        got = params[r]
        assert (got["do_remote_prefill"], got["remote_engine_id"], got["remote_host"], got["remote_port"]) == (
            True, "prefill-0", "127.0.0.1", p.port)
        assert (got["transfer_id"], got["remote_num_tokens"], len(got["remote_block_ids"])) == (r, n, -(-n // 16))
        assert got["remote_tp_size"] == p_tp
    # P holds every request's blocks until D has them, and asks vLLM to keep stepping meanwhile.
    state = p.call("stats")["state"]
    assert state["held"] == sorted(r for r, _ in REQUESTS) and state["push_work"] is True
    # The router's second leg: the same dicts in D's requests.
    added = d.call("add", requests=[{"id": f"d-{r}", "len": n, "params": params[r]} for r, n in REQUESTS])
    for r, n in REQUESTS:
        # write: an async load of the whole prompt; read: a sync load of all but the last token
        want = (n, True) if mode == "write" else (n - 1, False)
        assert (added[f"d-{r}"]["matched"], added[f"d-{r}"]["async"]) == want
    out = d.call("run", ids=[f"d-{r}" for r, _ in REQUESTS], until="result")
    assert out["pending"] == []
    assert out["state"]["results"] == {f"d-{r}": "done" for r, _ in REQUESTS}  # every byte checked
    assert all(s["invalid"] == [] for s in out["steps"])
    if mode == "write":  # the loads end through get_finished, one request each
        recving = [r for s in out["steps"] for r in s["recving"]]
        assert sorted(recving) == sorted(f"d-{r}" for r, _ in REQUESTS)
    stats = d.call("stats")  # summed over D's ranks
    assert stats["num_successful_transfers"] == len(REQUESTS) * d_tp and stats["num_failed_transfers"] == 0
    assert stats["state"]["free"] == N  # every D block is free again
    # P frees each request's blocks once D has it (get_finished's sending).
    out = p.call("run", ids=[r for r, _ in REQUESTS], until="freed")
    assert out["pending"] == [] and out["state"]["held"] == [] and out["state"]["free"] == N
    assert out["state"]["push_work"] is False
    ps = p.call("stats")
    assert ps["num_successful_transfers"] == len(REQUESTS) * p_tp and ps["num_failed_transfers"] == 0
    # The side that posts the transfers counts their bytes: P writes, D reads.
    moved = ps["bytes_transferred"] + stats["bytes_transferred"]
    assert moved == sum(n for _, n in REQUESTS) * 4 * 2 * 2 * 8 * 2  # layers, K/V, heads, head dim, 2 bytes
    assert time.monotonic() - start < 30


def test_a_router_that_sends_to_both_at_once_write_mode(pd):
    """D allocates (and tells P) before P has computed anything; P's layers go out as saved."""
    p, d = pd("write", "kv_first", "blocks_first")
    reqs = REQUESTS[:3]
    to_d = {"do_remote_prefill": True, "remote_engine_id": "prefill-0", "remote_host": "127.0.0.1",
            "remote_port": p.port, "remote_tp_size": 1}
    d.call("add", requests=[{"id": f"d-{r}", "len": n, "params": dict(to_d, transfer_id=f"x-{r}")} for r, n in reqs])
    first = d.call("step")  # start_load_kv: the allocations go to P
    assert first["recving"] == [] and first["state"]["results"] == {}
    prefill_with_ids(p, reqs)
    out = d.call("run", ids=[f"d-{r}" for r, _ in reqs], until="result")
    assert out["state"]["results"] == {f"d-{r}": "done" for r, _ in reqs}
    out = p.call("run", ids=[r for r, _ in reqs], until="freed")
    assert out["pending"] == [] and out["state"]["free"] == N


def prefill_with_ids(p: Instance, reqs):
    p.call("add", requests=[{"id": r, "len": n, "params": {"do_remote_decode": True, "transfer_id": f"x-{r}"}}
                            for r, n in reqs])
    assert p.call("run", ids=[r for r, _ in reqs], until="result")["pending"] == []


@pytest.mark.parametrize("mode", ["write", "read"])
def test_a_killed_prefill_is_reported_for_recompute(pd, mode):
    p, d = pd(mode)
    start = time.monotonic()
    reqs = REQUESTS[:2]
    if mode == "write":  # D waits for layers that never come: P dies with D's allocation
        to_d = {"do_remote_prefill": True, "remote_engine_id": "prefill-0", "remote_host": "127.0.0.1",
                "remote_port": p.port, "remote_tp_size": 1}
        added = d.call("add", requests=[{"id": r, "len": n, "params": dict(to_d, transfer_id=r)} for r, n in reqs])
        d.call("step")
        p.kill()
    else:  # P handed its params out, then died before D read them
        params = prefill(p, reqs)
        p.kill()
        added = d.call("add", requests=[{"id": r, "len": n, "params": params[r]} for r, n in reqs])
    out = d.call("run", ids=[r for r, _ in reqs], until="result", timeout_s=20)
    assert out["pending"] == []
    assert out["state"]["results"] == {r: "recompute" for r, _ in reqs}
    invalid = {b for s in out["steps"] for b in s["invalid"]}
    assert invalid == {b for r, _ in reqs for b in added[r]["blocks"]}  # every block of both, reported
    if mode == "write":  # the failed async loads still end through get_finished
        assert sorted(r for s in out["steps"] for r in s["recving"]) == [r for r, _ in reqs]
    stats = d.call("stats")
    assert stats["num_failed_transfers"] == len(reqs) and stats["state"]["free"] == N
    assert time.monotonic() - start < 30


def test_an_aborted_request_ends_on_both_sides(pd):
    p, d = pd("write", "kv_first", "kv_first")
    to_d = {"do_remote_prefill": True, "remote_engine_id": "prefill-0", "remote_host": "127.0.0.1",
            "remote_port": p.port, "remote_tp_size": 1}
    added = d.call("add", requests=[{"id": "d-a", "len": 50, "params": dict(to_d, transfer_id="a")},
                                    {"id": "d-b", "len": 20, "params": dict(to_d, transfer_id="b")}])
    d.call("step")
    # P's client gives up on "a" before its prefill ran; D learns it and recomputes.
    p.call("add", requests=[{"id": "a", "len": 50, "params": {"do_remote_decode": True, "transfer_id": "a"}}])
    assert p.call("abort", id="a")["delay_free"] is False
    p.call("step")
    t = time.monotonic()
    out = d.call("run", ids=["d-a"], until="result", timeout_s=15)
    assert time.monotonic() - t < FAST["transfer_timeout_ms"] / 1000  # told, not timed out
    assert out["state"]["results"] == {"d-a": "recompute"}
    assert {b for s in out["steps"] for b in s["invalid"]} == set(added["d-a"]["blocks"])
    # D's client gives up on "b" while it waits for P: the blocks stay held until ferry lets go.
    aborted = d.call("abort", id="d-b")
    assert aborted["delay_free"] is True
    out = d.call("run", ids=["d-b"], until="freed", timeout_s=15)
    assert out["pending"] == [] and out["state"]["free"] == N and out["state"]["held"] == []
    assert "d-b" in [r for s in out["steps"] for r in s["sending"]]
    assert p.call("stats")["state"]["free"] == N


def test_metadata_and_stats_types():
    meta = ferry.vllm.FerryConnectorMetadata(loads=[ferry.vllm.Load("r", "t", [1], 0, 16, "p", 0, 1, "h", 1)])
    import pickle
    assert pickle.loads(pickle.dumps(meta)) == meta
    a = ferry.vllm.FerryKVConnectorStats()
    assert a.is_empty()
    b = ferry.vllm.FerryKVConnectorStats()
    b.data["num_successful_transfers"], b.data["transfer_ms"] = 2, [1.0, 3.0]
    a.aggregate(b)
    assert a.reduce()["num_successful_transfers"] == 2 and a.reduce()["avg_transfer_ms"] == 2.0
    assert ferry.vllm.FerryConnector.build_kv_connector_stats({"x": 1}).data == {"x": 1}
