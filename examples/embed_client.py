"""The embedding offload from a GPU worker's side: start `ferry embed-serve` (CPU mode, a small
synthetic table), connect with ferry.embed_service.Client, run one forward step and check every
output row against the same rows computed in this process with ferry.embed.

    ferry embed-serve --socket S ...      the service: owns the table, computes n-gram row ids
    Client(S, dp_rank, tp_rank, ...)      a worker rank: writes a step's inputs into shared
                                          memory, prepare_forward(), wait(slot) per layer,
                                          reads output(slot), release_outputs()

Run: PYTHONPATH=<build>/python python3 examples/embed_client.py [path/to/ferry]
(the ferry binary defaults to $FERRY_BIN, then <build>/tools/ferry next to the module).
"""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import ferry
from ferry import embed, embed_service

# A small model: vocabulary, end-of-sequence id, n-gram size, heads per n-gram, embedding width
# (bf16 elements per token), smallest head table size, row padding; three embedding layers.
V, EOS, N, H, E, B, P = 1000, 2, 3, 2, 64, 97, 8
LAYERS = [0, 1, 2]


def ferry_binary():
    if len(sys.argv) > 1:
        return sys.argv[1]
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__))))
    return os.environ.get("FERRY_BIN") or os.path.join(build, "tools", "ferry")


def start_service(socket, ready):
    """Starts embed-serve and waits until its ready file appears (it builds the table first)."""
    args = [ferry_binary(), "embed-serve", "--socket", socket, "--ready-file", ready,
            "--vocab", str(V), "--eos", str(EOS), "--ngram", str(N), "--heads", str(H),
            "--embed-dim", str(E), "--base-vocab", str(B), "--padding", str(P),
            "--layers", *map(str, LAYERS), "--threads", "2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"embed-serve did not start: {proc.stdout.read().decode()}")
        time.sleep(0.01)
    return proc


def expected_rows(layer, tokens, qsl, ctx):
    """The rows the service should return, computed here: row ids, then a gather from the same
    synthetic table (row r holds a fixed pattern of r)."""
    config = embed.Config(vocab_size=V, eos_id=EOS, ngram_size=N, heads_per_ngram=H, embed_dim=E,
                          base_vocab=B, row_padding=P, layer=layer)
    layout = embed.Layout(config)
    ids = layout.row_ids(tokens, qsl, ctx)
    out = np.empty((len(tokens), E), np.uint16)  # bf16 bits
    embed.Gatherer(threads=1).gather(embed.Table.synthetic(layout, "bf16"), ids, out)
    return out.view(np.uint8)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        socket = os.path.join(tmp, "embed.sock")
        proc = start_service(socket, os.path.join(tmp, "ready"))
        try:
            # One rank (dp 0, tp 0 of 1). Buffers are sized once: max_tokens and max_reqs.
            c = embed_service.Client(socket, dp_rank=0, tp_rank=0, tp_size=1, max_tokens=256,
                                     max_reqs=16, context_len=N - 1, token_bytes=E * 2,
                                     layers=LAYERS, step_timeout_ms=5000)
            # A step of three requests: token ids, query_start_loc, and each request's last
            # N - 1 tokens before this step (its n-gram context); -1 is "no token".
            rng = np.random.default_rng(0)
            tokens = rng.integers(0, V, 100, dtype=np.int32)
            tokens[[10, 50]] = EOS
            qsl = np.array([0, 20, 70, 100], np.int32)
            ctx = rng.integers(-1, V, (3, N - 1), dtype=np.int32)
            c.input_ids[: len(tokens)] = tokens
            c.query_start_loc[: len(qsl)] = qsl
            c.ngram_context[:3] = ctx
            c.prepare_forward(3, len(tokens))
            for slot, layer in enumerate(LAYERS):
                c.wait(slot)  # raises ferry.Error if the step failed or the service died
                got = np.asarray(c.output(slot))[: len(tokens)]
                want = expected_rows(layer, tokens, qsl, ctx)
                assert want.any() and np.array_equal(got, want), f"layer {layer}: rows differ"
                print(f"layer {layer}: {len(tokens)} rows of {E * 2} bytes, as expected")
            c.release_outputs()  # after the forward: the service may overwrite the outputs
            c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
