"""The embedding-offload service's step against a torch (or, without torch, numpy) reference.

Usage (from a build tree):
    PYTHONPATH=build/release/python /usr/bin/python3 bench/embed_service_reference.py \
        --ferry build/release/tools/ferry [--cuda] [--base-vocab 100000] [--threads 2]

For each step shape (8192 tokens in 8 requests, 256 in 256) with the model's head layout
(V 248320, N 3, H 8, E 2560; B from --base-vocab so the synthetic table fits here), it times
  - ferry: a `ferry embed-serve` process and the Python client; request sent to every layer's
    DONE visible (with --cuda, outputs in GPU memory from torch tensors and a stream wait);
  - reference: the design of vLLM's PLE offload written with torch: the row ids by tensor ops
    (torch_row_ids below, checked against ferry's ids before timing), the rows by
    torch.index_select into pinned memory, then, with --cuda, one host-to-device copy. Without
    torch, numpy.take of rows whose ids were computed outside the timing.
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
    ap.add_argument("--uva", choices=["off", "always", "auto"], default=None,
                    help="the service's UVA mode (default: auto with --cuda, else off)")
    ap.add_argument("--copy-min-kib", type=int, default=1024)
    args = ap.parse_args()
    uva = args.uva or ("auto" if args.cuda else "off")
    if args.cuda and (torch is None or not torch.cuda.is_available()):
        raise SystemExit("--cuda needs torch with a GPU")

    tmp = tempfile.mkdtemp()
    sock, ready = os.path.join(tmp, "embed.sock"), os.path.join(tmp, "ready")
    proc = subprocess.Popen([
        args.ferry, "embed-serve", "--socket", sock, "--ready-file", ready, "--vocab", str(V),
        "--ngram", str(N), "--heads", str(H), "--embed-dim", str(E), "--base-vocab",
        str(args.base_vocab), "--padding", str(P), "--layers", "0", "--threads", str(args.threads),
        "--chunk-tokens", str(args.chunk_tokens), "--uva", uva, "--copy-min-kib",
        str(args.copy_min_kib)], stdout=subprocess.PIPE, text=True)
    try:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise SystemExit("embed-serve exited")
            time.sleep(0.05)
        run(args, sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate()
        # The service's own phase timings of every step of the run (warm-ups included).
        report = out[out.find("layer steps by token bucket"):] if out else ""
        if report:
            print("\nservice report (uva %s):\n%s" % (uva, report), end="")


def torch_row_ids(layout, tokens, qsl, ctx):
    """Row ids of one step by torch tensor ops (the reference's hashing), int64 [T * G].

    uint64 arithmetic is done in int64, whose multiplication and xor wrap to the same bits;
    the unsigned modulo is taken on the low 63 bits plus 2^63 mod m for negative values."""
    n, g = layout.ngram_size, layout.num_heads
    hpn = layout.config.heads_per_ngram
    eos = layout.config.eos_id
    m = [int(v) - (1 << 64) if int(v) >= 1 << 63 else int(v) for v in layout.multipliers]
    sizes = torch.tensor(list(layout.head_sizes), dtype=torch.int64)
    offsets = torch.tensor(list(layout.head_offsets), dtype=torch.int64)
    t_all = tokens.shape[0]
    used = int(qsl[-1])
    tok = tokens[:used].to(torch.int64).clamp_min(0)
    pos = torch.arange(used, dtype=torch.int64)
    req = torch.searchsorted(qsl[1:].to(torch.int64), pos, right=True)
    idx = pos - qsl[:-1].to(torch.int64)[req]
    ctx64 = ctx.to(torch.int64).clamp_min(0)
    mix = tok * m[0]
    blocked = torch.zeros(used, dtype=torch.bool)
    out = torch.empty(used, g, dtype=torch.int64)
    low63 = (1 << 63) - 1
    for s in range(1, n):
        from_step = tok[(pos - s).clamp_min(0)]
        from_ctx = ctx64[req, (n - 1 + idx - s).clamp(0, n - 2)]
        v = torch.where(idx >= s, from_step, from_ctx)
        y = torch.where(blocked, torch.full_like(v, eos), v)
        blocked = blocked | (v == eos)
        mix = mix ^ (y * m[s])
        for k in range(hpn):
            h = (s - 1) * hpn + k
            size = sizes[h]
            r = ((mix & low63) % size + (mix < 0).to(torch.int64) * ((1 << 63) % int(size))) % size
            out[:, h] = r + offsets[h]
    full = torch.full((t_all, g), -1, dtype=torch.int64)
    full[:used] = out
    return full.reshape(-1)


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
    ref_name = "torch ids + index_select" if torch is not None else "numpy.take"
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
        if torch is not None:
            tokens_t, qsl_t, ctx_t = torch.from_numpy(tokens), torch.from_numpy(qsl), torch.from_numpy(ctx)
            check = torch_row_ids(layout, tokens_t, qsl_t, ctx_t).numpy()
            if not np.array_equal(check, ids):
                raise SystemExit("the torch reference's row ids differ from ferry's")
        for it in range(args.iters + 1):
            t0 = time.perf_counter()
            if torch is None:
                out = np.take(rows_np, ids, axis=0)
            elif args.cuda:
                ids_t = torch_row_ids(layout, tokens_t, qsl_t, ctx_t)
                torch.index_select(table_t, 0, ids_t, out=staging[: ids.size])
                dev[: ids.size].copy_(staging[: ids.size], non_blocking=True)
                torch.cuda.current_stream().synchronize()
            else:
                out = torch.index_select(table_t, 0, torch_row_ids(layout, tokens_t, qsl_t, ctx_t))
            t1 = time.perf_counter()
            if it:
                ref.append((t1 - t0) * 1e3)
        s, r = float(np.median(svc)), float(np.median(ref))
        print(f"| {tokens_n} x {reqs} | {s:.3f} | {r:.3f} | {s / r:.2f} |")
    client.close()


if __name__ == "__main__":
    main()
