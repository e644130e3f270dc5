"""The embedding-offload service's step against a torch (or, without torch, numpy) reference.

Usage (from a build tree):
    PYTHONPATH=build/release/python /usr/bin/python3 bench/embed_service_reference.py \
        --ferry build/release/tools/ferry [--cuda] [--base-vocab 100000] [--threads 2]

For each step shape (8192 tokens in 8 requests, 256 in 256) with the model's head layout
(V 248320, N 3, H 8, E 2560; B from --base-vocab so the synthetic table fits here), it times
  - ferry: a `ferry embed-serve` process and the Python client; request sent to every layer's
    DONE visible (with --cuda, outputs in GPU memory from torch tensors and a stream wait);
  - reference: the same rows by torch.index_select on the same table (numpy.take without
    torch), then, with --cuda, a pinned staging copy and a host-to-device copy. The reference
    is handed the row ids, computed outside its timing (it does no hashing at all).
Medians of --iters steps, side by side in one run.
"""

import argparse
import os
import signal
import subprocess
import tempfile
import time

import numpy as np

import ferry
from ferry import embed, embed_service

try:
    import torch
except ImportError:  # the reference falls back to numpy
    torch = None

V, N, H, E, P = 248320, 3, 8, 2560, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--base-vocab", type=int, default=100000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cuda", action="store_true")
    args = ap.parse_args()
    if args.cuda and (torch is None or not torch.cuda.is_available()):
        raise SystemExit("--cuda needs torch with a GPU")

    tmp = tempfile.mkdtemp()
    sock, ready = os.path.join(tmp, "embed.sock"), os.path.join(tmp, "ready")
    proc = subprocess.Popen([
        args.ferry, "embed-serve", "--socket", sock, "--ready-file", ready, "--vocab", str(V),
        "--ngram", str(N), "--heads", str(H), "--embed-dim", str(E), "--base-vocab",
        str(args.base_vocab), "--padding", str(P), "--layers", "0", "--threads", str(args.threads),
        "--chunk-tokens", str(args.chunk_tokens)], stdout=subprocess.DEVNULL)
    try:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise SystemExit("embed-serve exited")
            time.sleep(0.05)
        run(args, sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def run(args, sock):
    layout = embed.Layout(embed.Config(vocab_size=V, eos_id=1, ngram_size=N, heads_per_ngram=H,
                                       embed_dim=E, base_vocab=args.base_vocab, row_padding=P))
    table = embed.Table.synthetic(layout, "bf16", threads=args.threads)
    rows_np = table.array()
    G, row_bytes = layout.num_heads, table.row_bytes
    token_bytes = G * row_bytes
    shapes = [(8192, 8), (256, 256)]
    max_tokens, max_reqs = 8192, 256
    common = dict(max_tokens=max_tokens, max_reqs=max_reqs, context_len=N - 1,
                  token_bytes=token_bytes, layers=[0])
    if args.cuda:
        outs = [torch.empty(max_tokens, token_bytes, dtype=torch.uint8, device="cuda")]
        flags = [torch.zeros(1, dtype=torch.int32, device="cuda")]
        client = embed_service.cuda_client(sock, outs, flags, **common)
        stream = torch.cuda.current_stream().cuda_stream
        table_t = torch.from_numpy(rows_np)
        staging = torch.empty(max_tokens * G, row_bytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(max_tokens * G, row_bytes, dtype=torch.uint8, device="cuda")
    else:
        client = embed_service.Client(sock, **common)
        stream = 0
        table_t = torch.from_numpy(rows_np) if torch is not None else None
    ref_name = "torch.index_select" if torch is not None else "numpy.take"
    if args.cuda:
        ref_name += " + pinned copy + H2D"
    print(f"| step (tokens x requests) | ferry service step ms | {ref_name} ms | ratio |")
    print("| --- | --- | --- | --- |")
    rng = np.random.default_rng(1)
    for tokens_n, reqs in shapes:
        tokens = rng.integers(0, V, tokens_n, dtype=np.int32)
        qsl = np.array([r * (tokens_n // reqs) for r in range(reqs)] + [tokens_n], np.int32)
        ctx = rng.integers(0, V, (reqs, N - 1), dtype=np.int32)
        ids = layout.row_ids(tokens, qsl, ctx).reshape(-1).astype(np.int64)
        svc = []
        for it in range(args.iters + 1):
            client.input_ids[:tokens_n] = tokens
            client.query_start_loc[: reqs + 1] = qsl
            client.ngram_context[:reqs] = ctx
            t0 = time.perf_counter()
            client.prepare_forward(reqs, tokens_n, stream=stream)
            client.wait(0, stream=stream)
            if args.cuda:
                torch.cuda.current_stream().synchronize()
            t1 = time.perf_counter()
            client.release_outputs(stream=stream)
            if it:
                svc.append((t1 - t0) * 1e3)
        ref = []
        ids_t = torch.from_numpy(ids) if torch is not None else None
        for it in range(args.iters + 1):
            t0 = time.perf_counter()
            if torch is None:
                out = np.take(rows_np, ids, axis=0)
            elif args.cuda:
                torch.index_select(table_t, 0, ids_t, out=staging[: ids.size])
                dev[: ids.size].copy_(staging[: ids.size], non_blocking=True)
                torch.cuda.current_stream().synchronize()
            else:
                out = torch.index_select(table_t, 0, ids_t)
            t1 = time.perf_counter()
            if it:
                ref.append((t1 - t0) * 1e3)
        s, r = float(np.median(svc)), float(np.median(ref))
        print(f"| {tokens_n} x {reqs} | {s:.3f} | {r:.3f} | {s / r:.2f} |")
    client.close()


if __name__ == "__main__":
    main()
