"""A KV connector worker of the soak: a producer or a consumer, in write or read mode.

Write mode: the consumer is the scheduler. It allocates blocks, calls expect_write() and tells
the producer (an engine notification on the application's topic) which request to save; the
producer fills its blocks with the request's data, saves every layer and seals.
Read mode: the producer holds filled blocks (hold_for_read()) and sends the packed ReadParams
to the consumer, which reads them into blocks of its own.

Either way the consumer checks every byte of a request that ended "done" against the data the
request id determines, and each side gives a request's blocks back only when the connector
reports it finished (exactly once). Peers are found through rundir/<pair>.<role>.json, written
again by each new incarnation (after a kill -9 the driver starts a new one).
"""

import argparse
import collections
import json
import os
import random
import sys

import numpy as np

import ferry
import ferry.kv as kv
from common import BlockPool, Reporter, Signals, Watch, make_engine, now_ms, pattern, publish

LAYERS, N, BS, H, D = 4, 64, 16, 2, 32
INFLIGHT = 4
ABORT_AFTER_MS = 20000  # a scheduler's own deadline: it gives up on a request (abort())
DEADLINE_MS = 40000     # by then every request must have ended (abort_timeout is 10 s)


def expected(request: str, layer: int, ntok: int) -> np.ndarray:
    """[2, ntok, H, D] uint16: K and V of the request's tokens in one layer."""
    return pattern(2 * ntok * H * D * 2, request, layer).view(np.uint16).reshape(2, ntok, H, D)


class Cache:
    """The worker's KV cache: one allocation, a [2, N, BS, H, D] (kv_first) or [N, 2, BS, H, D]
    (blocks_first) view a layer, so the connector maps between different layouts."""

    def __init__(self, order: str, shared: bool):
        shape = (LAYERS, 2, N, BS, H, D) if order == "kv_first" else (LAYERS, N, 2, BS, H, D)
        nbytes = int(np.prod(shape)) * 2
        buf = ferry.alloc_shared(nbytes) if shared else np.zeros(nbytes, np.uint8)
        self.whole = buf.view(np.uint16).reshape(shape)
        self.layers = [self.whole[i] for i in range(LAYERS)]
        self.order = order

    def kv(self, layer: int, which: int) -> np.ndarray:
        c = self.layers[layer]
        return c[which] if self.order == "kv_first" else c[:, which]

    def put(self, layer: int, blocks, data: np.ndarray) -> None:
        ntok = data.shape[1]
        for which in (0, 1):
            x = self.kv(layer, which)
            for i, b in enumerate(blocks):
                lo, hi = i * BS, min(ntok, (i + 1) * BS)
                if lo < hi:
                    x[b, : hi - lo] = data[which, lo:hi]

    def get(self, layer: int, blocks, ntok: int) -> np.ndarray:
        out = np.empty((2, ntok, H, D), np.uint16)
        for which in (0, 1):
            x = self.kv(layer, which)
            for i, b in enumerate(blocks):
                lo, hi = i * BS, min(ntok, (i + 1) * BS)
                if lo < hi:
                    out[which, lo:hi] = x[b, : hi - lo]
        return out

    def clear(self, blocks) -> None:
        for layer in range(LAYERS):
            for which in (0, 1):
                self.kv(layer, which)[blocks] = 0


class Worker:
    def __init__(self, a):
        self.a = a
        self.rep = Reporter(f"{a.pair}.{a.role}", a.inc, DEADLINE_MS, 20000)
        self.sig = Signals(self.rep)
        self.rng = random.Random(f"{a.seed}/{a.pair}/{a.role}/{a.inc}")
        key = f"{a.pair}.{a.role}.{a.run}.{a.inc}"
        opts = dict(key=key, transports=[a.transport])
        if a.transport == "ucx":
            opts.update(listen_host=a.listen, connect_timeout_ms=3000, handshake_timeout_ms=3000)
        self.engine = make_engine(self.rep, **opts)
        self.cache = Cache("blocks_first" if a.role == "producer" else "kv_first", a.transport == "shm")
        self.instance = f"{a.pair}-{a.role}"
        self.conn = kv.register_kv_caches(
            self.engine, self.cache.layers, model="soak", instance=self.instance, tp_rank=0, tp_size=1,
            block_tokens=BS, layout=self.cache.order, mode=a.mode, role=a.role, checksums=True,
            transfer_timeout_ms=8000, deferred_write_timeout_ms=8000, abort_timeout_ms=10000,
            liveness_interval_ms=500, handshake_timeout_ms=3000)
        self.pool = BlockPool(N, self.rep)
        self.ended = collections.deque(maxlen=4096)  # requests that ended here, latest last
        # Write-mode producer: requests the connector ended before this worker began them (the
        # consumer's allocation opened them, its abort ended them), their Finished already taken.
        # A request notice that arrives after that still begins the request: the connector must
        # refuse its saves (FAILED_PRECONDITION), not take them and never report it again.
        self.ended_unbegun = collections.deque(maxlen=4096)
        # Begun here, then refused as already ended, with the Finished still queued: finish()
        # ends them when it comes (its blocks are not this worker's).
        self.refused = set()
        self.reqs = {}  # request -> (blocks, ntok, started_ms, aborted)
        self.peer_key = None
        other = "consumer" if a.role == "producer" else "producer"
        self.peer_instance = f"{a.pair}-{other}"
        self.watch = Watch(a.rundir, f"{a.pair}.{other}")
        self.seq = 0
        self.next_ms = 0.0
        self.initiator = (a.mode == "write") == (a.role == "consumer")
        publish(a.rundir, f"{a.pair}.{a.role}", {"key": key, "inc": a.inc, "meta": self.conn.metadata().hex()})

    # ---- peers and requests ---------------------------------------------------------------

    def follow_peer(self) -> None:
        rec = self.watch.changed()
        if rec is None:
            return
        try:
            self.conn.add_peer(bytes.fromhex(rec["meta"]))
            self.peer_key = rec["key"]
            self.rep.count("peers_learnt")
        except ferry.Error as e:
            self.rep.count("errors_raised")
            self.rep.codes["add_peer:" + e.code] = self.rep.codes.get("add_peer:" + e.code, 0) + 1

    def new_request(self):
        k = self.rng.randint(1, 4)
        blocks = self.pool.take(k)
        if blocks is None:
            return None
        ntok = self.rng.randint((k - 1) * BS + 1, k * BS)
        self.seq += 1
        return f"{self.a.pair}.{self.a.inc}.{self.seq}", blocks, ntok

    def fail_early(self, req: str, blocks, e: "ferry.Error", held: bool) -> None:
        """A call on `req` raised. If an earlier call made the connector hold it (held), it
        still ends exactly once through wait_finished: abort it (NOT_FOUND when it ended in the
        meantime, its Finished already queued). If not, it ends here and its blocks come back."""
        if held:
            try:
                self.conn.abort(req)
            except ferry.Error:
                pass
            return
        sys.stderr.write(f"soak: {req}: {e.code} ({e.message}) before the connector held it; ended here\n")
        self.reqs.pop(req, None)
        self.rep.end(req, e.code)
        self.ended.append(req)
        self.pool.give(blocks)

    def ended_before(self, req: str) -> None:
        """The connector refused a save or seal of `req`: it ended here already (its consumer
        aborted it), and its Finished is queued, or was taken before this worker began it."""
        self.rep.count("refused_ended_unbegun")
        if req in self.ended_unbegun:
            sys.stderr.write(f"soak: {req}: ended by the connector before its notice came; refused\n")
            blocks = self.reqs.pop(req)[0]
            self.rep.end(req, "FAILED_PRECONDITION")
            self.ended.append(req)
            self.pool.give(blocks)
        else:
            self.refused.add(req)

    def issue(self) -> None:
        if self.rep.draining or self.peer_key is None or len(self.reqs) >= INFLIGHT:
            return
        if now_ms() < self.next_ms:  # paced: the machine is shared with the other roles
            return
        self.next_ms = now_ms() + 1000.0 / self.a.rate
        made = self.new_request()
        if made is None:
            return
        req, blocks, ntok = made
        self.rep.start(req)
        self.reqs[req] = [blocks, ntok, now_ms(), False]
        try:
            if self.a.mode == "write":  # consumer
                self.cache.clear(blocks)
                self.conn.expect_write(req, self.peer_instance, 0, blocks, ntok)
                msg = json.dumps({"r": req, "n": ntok, "k": len(blocks)}).encode()
            else:  # producer
                for layer in range(LAYERS):
                    self.cache.put(layer, blocks, expected(req, layer, ntok))
                msg = b"R" + self.conn.hold_for_read(req, blocks, ntok).pack()
        except ferry.Error as e:
            self.reqs.pop(req, None)
            self.rep.end(req, e.code)
            self.pool.give(blocks)
            return
        try:
            self.engine.notify(self.peer_key, msg)
        except ferry.Error as e:
            self.rep.count("notify_failed")
            self.fail_early(req, blocks, e, held=True)

    def serve(self) -> None:
        """The responder's side: requests the initiator sent on the application's topic."""
        for _, msg in self.engine.pop_notifications():
            if self.sig.quit:
                return
            if self.a.mode == "write":  # producer
                m = json.loads(msg)
                req, ntok, k = m["r"], m["n"], m["k"]
                blocks = self.pool.take(k)
                if blocks is None:
                    self.rep.count("refused_no_blocks")
                    continue
                self.rep.start(req)
                self.reqs[req] = [blocks, ntok, now_ms(), False]
                saved = 0
                try:
                    for layer in range(LAYERS):
                        self.cache.put(layer, blocks, expected(req, layer, ntok))
                        self.conn.save_layer(req, layer, blocks)
                        saved += 1
                    self.conn.seal(req, LAYERS)
                except ferry.Error as e:
                    if e.code == "FAILED_PRECONDITION":
                        self.ended_before(req)
                    else:
                        self.fail_early(req, blocks, e, held=saved > 0)
            else:  # consumer, read mode
                params = kv.ReadParams.unpack(msg[1:])
                req, ntok = params.request, params.num_tokens
                blocks = self.pool.take(len(params.blocks))
                if blocks is None:
                    self.rep.count("refused_no_blocks")
                    continue
                self.rep.start(req)
                self.reqs[req] = [blocks, ntok, now_ms(), False]
                self.cache.clear(blocks)
                try:
                    self.conn.start_read(msg[1:], blocks)
                except ferry.Error as e:
                    self.fail_early(req, blocks, e, held=False)

    def verify(self, req: str, blocks, ntok: int) -> int:
        """Bytes of `req` that differ from what the producer wrote (0 when all arrived)."""
        bad = 0
        for layer in range(LAYERS):
            got, want = self.cache.get(layer, blocks, ntok), expected(req, layer, ntok)
            bad += int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8)))
        self.rep.count("verified_bytes", LAYERS * 2 * ntok * H * D * 2)
        return bad

    def finish(self, timeout_ms: float) -> None:
        for f in self.conn.wait_finished(timeout_ms):
            entry = self.reqs.pop(f.request, None)
            if entry is None:
                if f.request in self.ended:
                    self.rep.count("ended_twice")
                    sys.stderr.write(f"soak: {f!r} ended again\n")
                else:  # a producer learns a request from the consumer's allocation: told it ended
                    self.rep.count("finished_not_begun")
                    self.ended_unbegun.append(f.request)
                    sys.stderr.write(f"soak: {f!r} was not begun here\n")
                continue
            self.ended.append(f.request)
            blocks, ntok = entry[0], entry[1]
            if f.request in self.refused:  # opened by the consumer's allocation, not by its saves
                self.refused.discard(f.request)
            elif list(f.blocks) != list(blocks):
                self.rep.count("blocks_mismatch")
            code = "OK" if f.outcome == "done" else (f.code if f.code != "OK" else f.outcome.upper())
            if code == "OK" and self.a.role == "consumer":
                bad = self.verify(f.request, blocks, ntok)
                if bad:
                    self.rep.count("corrupt_bytes", bad)
                    sys.stderr.write(f"soak: {f.request}: {bad} bytes differ\n")
                    code = "CORRUPT"
            self.rep.end(f.request, code)
            self.pool.give(blocks)

    def abort_stale(self) -> None:
        t = now_ms()
        for req, entry in list(self.reqs.items()):
            if not entry[3] and t - entry[2] > ABORT_AFTER_MS:
                entry[3] = True
                self.rep.count("aborted_by_worker")
                try:
                    self.conn.abort(req)
                except ferry.Error:
                    pass

    def run(self) -> None:
        self.rep.run_ticks()
        while not self.sig.quit:
            self.follow_peer()
            if self.initiator:
                self.issue()
            else:
                self.serve()
            self.finish(20)
            self.abort_stale()
        self.rep.extra.update(self.final())
        self.rep.stop_ticks()
        self.rep.emit("final")

    def final(self) -> dict:
        stats = self.conn.stats()
        pending = self.conn.pending
        leaked = self.pool.leaked()
        self.conn.close()
        self.engine.close()
        return {"blocks_leaked": leaked, "connector_pending": pending,
                "stats": {k: stats[k] for k in ("requests_done", "requests_failed", "requests_aborted",
                                                "blocks_expired", "checksum_failures", "peers_lost",
                                                "peers_fenced", "messages_rejected")}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pair", required=True)
    p.add_argument("--role", choices=["producer", "consumer"], required=True)
    p.add_argument("--mode", choices=["write", "read"], required=True)
    p.add_argument("--transport", choices=["ucx", "shm"], required=True)
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--rundir", required=True)
    p.add_argument("--run", default=str(os.getppid()))
    p.add_argument("--inc", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=40.0, help="requests a second at most (initiator)")
    Worker(p.parse_args()).run()


if __name__ == "__main__":
    main()
