"""ferry.embed against an independent pure-Python reference of the row-id specification.

The reference below is written from the specification (the issue's text, quoted in
src/embed/config.h and row_ids.h), not from the C++: Python integers masked to 64 bits,
primes by trial division, seg(p) by a backwards search, y_s by its definition. The decisions
the specification leaves open are those row_ids.h documents: negative ids (tokens and
context) read as 0, context entries may be EOS, only tokens inside requests are validated.
"""

import json
import os
import random
import struct

import numpy as np
import pytest

import ferry
from ferry import embed

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(x):
    x = (x + GOLDEN) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    d = 3
    while d * d <= n:
        if n % d == 0:
            return False
        d += 2
    return True


class Reference:
    """Multipliers, head sizes and offsets, table rows and row ids, per the specification."""

    def __init__(self, V, EOS, N, H, E, B, P=128, S=1234, L=0):
        self.V, self.EOS, self.N, self.H, self.E = V, EOS, N, H, E
        self.G = (N - 1) * H
        half = max(1, ((2**63 - 1) // V) // 2)
        self.m = [
            2 * (splitmix64((S + 10007 * L + GOLDEN * (k + 1)) & MASK) % half) + 1
            for k in range(N)
        ]
        primes, n = [], B  # primes strictly greater than B - 1, counted from the first
        while len(primes) < L * self.G + self.G:
            if is_prime(n):
                primes.append(n)
            n += 1
        self.sizes = primes[L * self.G :]
        self.offsets = [sum(self.sizes[:h]) for h in range(self.G)]
        total = sum(self.sizes)
        self.used_rows = total
        self.table_rows = -(-total // P) * P

    def row_ids(self, tokens, qsl, ctx):
        N, EOS, G, H = self.N, self.EOS, self.G, self.H
        out = [[embed.PADDING_ROW] * G for _ in tokens]
        for r in range(len(qsl) - 1):
            c = [max(0, v) for v in ctx[r * (N - 1) : (r + 1) * (N - 1)]]
            t = [max(0, v) for v in tokens[qsl[r] : qsl[r + 1]]]
            x = c + t
            for j in range(len(t)):
                p = N - 1 + j
                q = -1
                for i in range(p - 1, -1, -1):
                    if x[i] == EOS:
                        q = i
                        break
                seg = p - q - 1
                y = [x[p - s] if p - s >= 0 and seg >= s else EOS for s in range(N)]
                for n in range(2, N + 1):
                    mix = 0
                    for s in range(n):
                        mix ^= (y[s] * self.m[s]) & MASK
                    for h in range((n - 2) * H, (n - 1) * H):
                        out[qsl[r] + j][h] = mix % self.sizes[h] + self.offsets[h]
        return np.array(out, dtype=np.uint64).reshape(len(tokens), G)


def make(ref, S=1234, L=0, P=128, B=None):
    return embed.Layout(
        embed.Config(
            vocab_size=ref.V, eos_id=ref.EOS, ngram_size=ref.N, heads_per_ngram=ref.H,
            embed_dim=ref.E, base_vocab=B, row_padding=P, seed=S, layer=L,
        )
    )


def random_case(rng, N, V, EOS, max_reqs=6, max_len=40):
    """Requests of random lengths (0 and 1 included), EOS and negative ids inside, padding."""
    reqs = rng.randrange(0, max_reqs + 1)
    lens = [rng.choice([0, 1, 1, 2, rng.randrange(0, max_len + 1)]) for _ in range(reqs)]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    pad = rng.randrange(0, 5)

    def token():
        k = rng.random()
        if k < 0.2:
            return EOS
        if k < 0.3:
            return -rng.randrange(1, 3)
        if k < 0.5:
            return rng.randrange(0, min(V, 4))  # repeats of a few ids
        return rng.randrange(0, V)

    tokens = [token() for _ in range(qsl[-1])] + [rng.randrange(-5, min(2 * V, 2**31 - 1)) for _ in range(pad)]
    ctx = [token() for _ in range(reqs * (N - 1))]
    return tokens, qsl, ctx


def test_model_layout():
    ref = Reference(248320, 1, 3, 8, 2560, 20_000_000)
    layout = embed.Layout(embed.Config.model(eos_id=1))
    assert layout.num_heads == 16 and layout.head_dim == 160
    assert layout.multipliers == ref.m
    assert layout.head_sizes == ref.sizes
    assert layout.head_offsets == ref.offsets
    assert layout.table_rows == ref.table_rows
    ref2 = Reference(248320, 1, 3, 8, 2560, 20_000_000, L=2)
    layout2 = embed.Layout(embed.Config.model(eos_id=1, layer=2))
    assert layout2.multipliers == ref2.m and layout2.head_sizes == ref2.sizes


@pytest.mark.parametrize("N", [2, 3, 4])
def test_random_configs_and_streams(N):
    rng = random.Random(1000 + N)
    for trial in range(20):
        H = rng.randrange(1, 4)
        G = (N - 1) * H
        V = rng.choice([5, 300, 248320, rng.randrange(2, 1 << 31)])
        EOS = rng.randrange(0, V)
        B = rng.choice([1, 2, 97, rng.randrange(1, 1 << 20)])
        P = rng.choice([1, 7, 128])
        S = rng.randrange(0, 1 << 64)
        L = rng.randrange(0, 4)
        ref = Reference(V, EOS, N, H, G * rng.choice([1, 16]), B, P=P, S=S, L=L)
        layout = make(ref, S=S, L=L, P=P, B=B)
        assert layout.multipliers == ref.m
        assert layout.head_sizes == ref.sizes
        assert layout.head_offsets == ref.offsets
        assert layout.table_rows == ref.table_rows
        for case in range(8):
            tokens, qsl, ctx = random_case(rng, N, V, EOS)
            want = ref.row_ids(tokens, qsl, ctx)
            got = layout.row_ids(
                np.array(tokens, np.int32), np.array(qsl, np.int32), np.array(ctx, np.int32)
            )
            assert got.dtype == np.uint64 and got.shape == (len(tokens), G)
            np.testing.assert_array_equal(got, want, err_msg=f"trial {trial} case {case}")


def test_eos_cases_by_hand():
    ref = Reference(50, 7, 3, 1, 2, 11)
    layout = make(ref, B=11)
    # EOS first in the step, twice in a row, last; a context that is all EOS; one token.
    cases = [
        ([7, 3, 4, 7, 7, 5], [0, 6], [1, 2]),
        ([3, 7], [0, 1, 2], [7, 7, 2, 7]),
        ([9], [0, 1], [-1, -1]),
        ([], [0], []),
        ([4, 4, 4], [0, 0, 0, 1], [1, 1, 2, 2, 3, 3]),
    ]
    for tokens, qsl, ctx in cases:
        np.testing.assert_array_equal(
            layout.row_ids(tokens, qsl, ctx).reshape(len(tokens), 2),
            ref.row_ids(tokens, qsl, ctx).reshape(len(tokens), 2),
        )


def test_large_step_threads_agree():
    ref = Reference(248320, 1, 3, 8, 2560, 20_000_000)
    layout = embed.Layout(embed.Config.model(eos_id=1))
    rng = np.random.default_rng(5)
    qsl = np.array([0, 1000, 1001, 1001, 4000, 6000], np.int32)
    tokens = rng.integers(0, 248320, 6100, dtype=np.int32)
    tokens[rng.integers(0, 6000, 300)] = 1  # EOS
    ctx = rng.integers(-1, 248320, 5 * 2, dtype=np.int32)
    one = layout.row_ids(tokens, qsl, ctx)
    four = layout.row_ids(tokens, qsl, ctx, threads=4)
    np.testing.assert_array_equal(one, four)
    sample = slice(990, 1010)  # the reference on the boundary of requests 0, 1, 2
    np.testing.assert_array_equal(one[sample], ref.row_ids(tokens.tolist(), qsl.tolist(), ctx.tolist())[sample])
    assert (one[6000:] == embed.PADDING_ROW).all()


def test_input_errors():
    layout = make(Reference(100, 3, 3, 1, 2, 11), B=11)

    def code(tokens, qsl, ctx):
        with pytest.raises(ferry.Error) as e:
            layout.row_ids(np.array(tokens), np.array(qsl), np.array(ctx))
        return e.value.code

    assert code([1, 100], [0, 2], [0, 0]) == "OUT_OF_RANGE"  # id == V
    assert code([1, 2**40], [0, 2], [0, 0]) == "OUT_OF_RANGE"  # saturated, still >= V
    assert code([1, 2], [0, 2], [0, 100]) == "OUT_OF_RANGE"  # context id == V
    assert code([1, 2], [0, 3], [0, 0]) == "OUT_OF_RANGE"  # past num_tokens
    assert code([1, 2], [0, 2, 1], [0, 0, 0, 0]) == "INVALID_ARGUMENT"  # decreasing
    assert code([1, 2], [1, 2], [0, 0]) == "INVALID_ARGUMENT"  # first != 0
    assert code([1, 2], [], []) == "INVALID_ARGUMENT"
    assert code([1, 2], [0, 2], [0]) == "INVALID_ARGUMENT"  # context size
    with pytest.raises(ferry.Error) as e:
        layout.row_ids(np.array([1.5]), np.array([0, 1]), np.array([0, 0]))
    assert e.value.code == "INVALID_ARGUMENT"
    # ids past the last request are padding and never validated
    layout.row_ids(np.array([1, 10**6]), np.array([0, 1]), np.array([0, 0]))
    with pytest.raises(ferry.Error) as e:
        embed.Layout(embed.Config(vocab_size=100, eos_id=100, ngram_size=3, heads_per_ngram=1,
                                  embed_dim=2, base_vocab=11))
    assert e.value.code == "INVALID_ARGUMENT"


def synthetic_row(row, row_bytes):
    """The synthetic table's pattern (table.h): word w of row r is splitmix64(r) + w * golden."""
    base = splitmix64(row)
    words = b"".join(
        struct.pack("<Q", (base + w * GOLDEN) & MASK) for w in range(-(-row_bytes // 8))
    )
    return words[:row_bytes]


def expected_rows(rows_of, ids, row_bytes):
    out = bytearray(ids.size * row_bytes)
    for i, r in enumerate(ids.reshape(-1).tolist()):
        if r != embed.PADDING_ROW:
            out[i * row_bytes : (i + 1) * row_bytes] = rows_of(r)
    return bytes(out)


@pytest.mark.parametrize("dtype,row_bytes", [("bf16", 64), ("f32", 128), ("f8_e4m3", 32), ("nvfp4", 18)])
def test_gather_synthetic_byte_for_byte(dtype, row_bytes):
    ref = Reference(1000, 5, 3, 2, 4 * 32, 300, P=64)
    layout = make(ref, B=300, P=64)
    assert layout.head_dim == 32
    table = embed.Table.synthetic(layout, dtype, threads=2)
    assert table.rows == ref.table_rows and table.row_bytes == row_bytes and table.dtype == dtype
    assert table.row(17) == synthetic_row(17, row_bytes) == embed.synthetic_row(17, row_bytes)
    view = table.array()
    assert view.shape == (table.rows, row_bytes) and not view.flags.writeable
    rng = random.Random(9)
    for threads in (1, 3):
        gatherer = embed.Gatherer(threads=threads, chunk_tokens=5)
        tokens, qsl, ctx = random_case(rng, 3, 1000, 5, max_reqs=8, max_len=60)
        ids = ref.row_ids(tokens, qsl, ctx)
        out = np.full(len(tokens) * 4 * row_bytes, 0xAB, np.uint8)
        gatherer.gather(table, ids, out)
        assert out.tobytes() == expected_rows(lambda r: synthetic_row(r, row_bytes), ids, row_bytes)
        fused = np.zeros_like(out)
        gatherer.gather_step(layout, table, tokens, qsl, ctx, fused)
        assert fused.tobytes() == out.tobytes()


def write_safetensors(path, name, array, dtype_name):
    header = {name: {"dtype": dtype_name, "shape": list(array.shape),
                     "data_offsets": [0, array.nbytes]}, "__metadata__": {"by": "test"}}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + array.tobytes())


def test_gather_from_safetensors_shards(tmp_path):
    ref = Reference(600, 2, 4, 1, 3 * 16, 100, P=32)
    layout = make(ref, B=100, P=32)
    rows = np.random.default_rng(2).integers(0, 1 << 16, (ref.table_rows, 16), dtype=np.uint16)
    cut = 123
    paths = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    write_safetensors(paths[0], "ngram", rows[:cut], "BF16")
    write_safetensors(paths[1], "ngram", rows[cut:], "BF16")
    table = embed.Table.open(layout, paths)
    assert table.rows == ref.table_rows and table.num_segments == 2 and table.dtype == "bf16"
    tokens, qsl, ctx = random_case(random.Random(4), 4, 600, 2, max_reqs=5, max_len=80)
    ids = ref.row_ids(tokens, qsl, ctx)
    out = np.zeros((len(tokens), 48), np.uint16)  # [T, E] bf16 bits
    embed.Gatherer(threads=2, chunk_tokens=3).gather_step(layout, table, tokens, qsl, ctx, out)
    want = expected_rows(lambda r: rows[r].tobytes(), ids, 32)
    assert out.tobytes() == want
    with pytest.raises(ferry.Error) as e:
        table.array()
    assert e.value.code == "FAILED_PRECONDITION"
    # Rows that match neither the padded nor the unpadded count.
    write_safetensors(paths[1], "ngram", rows[cut:-1], "BF16")
    with pytest.raises(ferry.Error) as e:
        embed.Table.open(layout, paths)
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ferry.Error) as e:
        embed.Table.open(layout, [str(tmp_path / "missing.safetensors")])
    assert e.value.code == "NOT_FOUND"


def test_gather_errors():
    layout = make(Reference(100, 3, 2, 2, 2 * 8, 50), B=50)
    table = embed.Table.synthetic(layout, "bf16")
    g = embed.Gatherer()
    ids = np.array([[0, table.rows]], np.uint64)
    out = np.zeros(2 * 16, np.uint8)
    with pytest.raises(ferry.Error) as e:
        g.gather(table, ids, out)
    assert e.value.code == "OUT_OF_RANGE"
    with pytest.raises(ferry.Error) as e:
        g.gather(table, np.array([[0, 1]], np.uint64), np.zeros(31, np.uint8))
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ferry.Error) as e:
        g.gather(table, np.array([[0, 1]], np.uint64), np.zeros(64, np.uint8)[::2])
    assert e.value.code == "INVALID_ARGUMENT"
