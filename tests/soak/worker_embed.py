"""The embedding client of the soak: steps `ferry embed-serve` (CPU mode, a synthetic table)
and checks every output row against the pure-Python reference of the row-id specification
(tests/python/test_embed_ids.py: Reference, synthetic_row, expected_rows).

A step that raises (the service killed or stopped, a step deadline) counts as failed with its
code; the client then closes and connects again (the driver restarts a killed service on the
same socket path). EMBED_ARGS are the service's flags; soak.py starts it with them.
"""

import argparse
import os
import random
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import ferry  # noqa: E402
from ferry import embed_service  # noqa: E402
from common import Reporter, Signals  # noqa: E402
from test_embed_ids import Reference, expected_rows, synthetic_row  # noqa: E402

V, EOS, N, H, E, B, P = 1000, 2, 3, 2, 64, 97, 8
ROW_BYTES = E // ((N - 1) * H) * 2
LAYERS = [0, 1]
MAX_TOKENS, MAX_REQS = 64, 8
STEP_TIMEOUT_MS = 4000
EMBED_ARGS = ["--vocab", str(V), "--eos", str(EOS), "--ngram", str(N), "--heads", str(H),
              "--embed-dim", str(E), "--base-vocab", str(B), "--padding", str(P),
              "--layers", *map(str, LAYERS), "--threads", "1", "--chunk-tokens", "16",
              "--wait-timeout", "3"]


def make_step(rng: random.Random):
    reqs = rng.randint(1, MAX_REQS)
    tokens_n = rng.randint(reqs, MAX_TOKENS)
    cuts = sorted(rng.sample(range(1, tokens_n), reqs - 1)) if reqs > 1 else []
    qsl = [0, *cuts, tokens_n]

    def token():
        k = rng.random()
        return EOS if k < 0.05 else rng.randrange(0, V)

    return [token() for _ in range(tokens_n)], qsl, [token() for _ in range(reqs * (N - 1))]


class Worker:
    def __init__(self, a):
        self.a = a
        self.rep = Reporter("embed.client", a.inc, STEP_TIMEOUT_MS, 20000)
        self.sig = Signals(self.rep)
        self.rng = random.Random(f"{a.seed}/embed/{a.inc}")
        self.refs = {layer: Reference(V, EOS, N, H, E, B, P=P, L=layer) for layer in LAYERS}
        self.rows = {}
        self.client = None
        self.seq = 0

    def row(self, r):
        got = self.rows.get(r)
        if got is None:
            got = synthetic_row(r, ROW_BYTES)
            if len(self.rows) < 4096:  # bounded: the soak watches this process's memory
                self.rows[r] = got
        return got

    def connect(self) -> bool:
        try:
            self.client = embed_service.Client(
                self.a.socket, dp_rank=0, tp_rank=0, tp_size=1, max_tokens=MAX_TOKENS, max_reqs=MAX_REQS,
                context_len=N - 1, token_bytes=E * 2, layers=LAYERS, connect_timeout_ms=1000,
                step_timeout_ms=STEP_TIMEOUT_MS)
            self.rep.count("connects")
            return True
        except ferry.Error:
            self.rep.count("connect_failed")
            return False

    def step(self) -> None:
        c = self.client
        tokens, qsl, ctx = make_step(self.rng)
        self.seq += 1
        name = f"e{self.a.inc}.{self.seq}"
        self.rep.start(name)
        try:
            c.input_ids[: len(tokens)] = tokens
            c.query_start_loc[: len(qsl)] = qsl
            c.ngram_context[: len(qsl) - 1] = np.array(ctx, np.int32).reshape(-1, N - 1)
            c.prepare_forward(len(qsl) - 1, len(tokens))
            bad = 0
            for slot, layer in enumerate(LAYERS):
                c.wait(slot)
                want = expected_rows(self.row, self.refs[layer].row_ids(tokens, qsl, ctx), ROW_BYTES)
                got = c.output(slot)[: len(tokens)].tobytes()
                bad += sum(x != y for x, y in zip(got, want)) + abs(len(got) - len(want))
                self.rep.count("verified_bytes", len(want))
            c.release_outputs()
        except ferry.Error as e:
            self.rep.end(name, e.code)
            try:
                c.close()
            except ferry.Error:
                pass
            self.client = None
            return
        if bad:
            self.rep.count("corrupt_bytes", bad)
            sys.stderr.write(f"soak: embedding step {name}: {bad} bytes differ\n")
        self.rep.end(name, "CORRUPT" if bad else "OK")

    def run(self) -> None:
        self.rep.run_ticks()
        next_ms = 0.0
        while not self.sig.quit:
            if self.rep.draining:
                time.sleep(0.05)
                continue
            if self.client is None and not self.connect():
                time.sleep(0.2)
                continue
            t = time.monotonic() * 1000
            if t < next_ms:
                time.sleep((next_ms - t) / 1000)
            next_ms = time.monotonic() * 1000 + 1000.0 / self.a.rate
            self.step()
        if self.client is not None:
            self.client.close()
        self.rep.stop_ticks()
        self.rep.emit("final")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--inc", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=10.0)
    a = p.parse_args()
    Worker(a).run()


if __name__ == "__main__":
    main()
