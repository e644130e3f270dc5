#!/usr/bin/env python3
"""The write-mode hang of the soak of 2026-12-03 (bench/results/soak.md, "The write-mode hang"):
a producer-side request that the connector opened from the consumer's allocation and ended
(the consumer aborted) before the producer's application began it. The producer's application
is told (a Finished it never began); when it then begins the request (SaveLayer + Seal, both
answered OK), the connector ignores both and never reports the request again, so an
application that waits for its Finished waits for ever.

    PYTHONPATH=build/release/python python3 tests/soak/repro_kv_ended_unbegun.py

Exit status: 0 when the late SaveLayer/Seal are refused or end in a Finished, 1 when they are
silently dropped (the behaviour of 2026-12-03), 77 when it cannot run here.
"""

import sys
import time

import numpy as np

import ferry
import ferry.kv as kv

LAYERS, N, BS, H, D = 2, 8, 16, 2, 32


def connector(key, role):
    e = ferry.Engine(key=key, transports=["ucx"], listen_host="127.0.0.1")
    caches = [np.zeros((2, N, BS, H, D), np.uint16) for _ in range(LAYERS)]
    c = kv.register_kv_caches(e, caches, model="m", instance=key, tp_rank=0, tp_size=1, block_tokens=BS,
                              layout="kv_first", mode="write", role=role, abort_timeout_ms=10000,
                              deferred_write_timeout_ms=3000, transfer_timeout_ms=3000)
    return e, c, caches


def drain(c, secs):
    out, end = [], time.monotonic() + secs
    while time.monotonic() < end:
        out += c.wait_finished(100)
    return out


def main():
    try:
        pe, p, _ = connector("P", "producer")
        ce, c, _ = connector("C", "consumer")
    except ferry.Error as e:
        print(f"repro: cannot make ucx engines here: {e}")
        return 77
    p.add_peer(c.metadata())
    c.add_peer(p.metadata())
    c.expect_write("r1", "P", 0, [0, 1], 20)   # the consumer allocates; P's connector learns r1
    time.sleep(1.0)
    c.abort("r1")                              # ... and gives up before P's application began r1
    got_p = drain(p, 3.0)
    got_c = drain(c, 1.0)
    print("producer finished before begun:", [(f.request, f.outcome) for f in got_p])
    print("consumer finished:", [(f.request, f.outcome) for f in got_c])
    # The request notice reaches P's application only now: it begins r1.
    refused = None
    try:
        for layer in range(LAYERS):
            p.save_layer("r1", layer, [2, 3])
        p.seal("r1", LAYERS)
    except ferry.Error as e:
        refused = e.code
    late = drain(p, 15.0)  # past deferred_write_timeout and transfer_timeout
    print(f"late save/seal refused: {refused}; finished after: {[(f.request, f.outcome) for f in late]}; "
          f"pending: {p.pending}")
    p.close(); c.close(); pe.close(); ce.close()
    if refused is None and not late:
        print("repro: r1 begun after it ended here is never reported: an application waiting for it hangs")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
