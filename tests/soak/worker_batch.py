"""A plain-batch worker of the soak: a sender posts write_batch() of scattered pieces with a
notification, and a receiver checks the pieces when the notification comes (ferry delivers it
after the data is in place) and acknowledges with a notification of its own.

The sender's region and the receiver's are SLOTS slots of SLOT bytes; a batch stays inside one
slot, whose bytes are slot_data(incarnation, seq): words that name their batch, so bytes that
arrive wrong say which batch they came from (the sender logs its failed batches). A slot is
reused only after the receiver acknowledged it, a new receiver incarnation appeared (a fresh
region), or, after a failed or unacknowledged batch, a fence: a failed batch's pieces and its
notification may still sit in a stalled link for any length of time (bench/results/soak.md,
Diagnosis), and only the receiver's Engine.fence_peer ends that. The sender then stops issuing,
lets its transfers end, asks the receiver to fence it ({"fence": n}, after every earlier
notification on the same connection), and once the receiver answers {"fenced": n} opens a new
session and frees the slots.
"""

import argparse
import json
import os
import random
import sys
import time

import numpy as np

import ferry
from common import Reporter, Signals, Watch, make_engine, now_ms, publish

SLOTS, SLOT = 16, 64 << 10
XFER_DEADLINE_MS = 5000
ACK_DEADLINE_MS = 10000
FENCE_RETRY_MS = 10000  # ask again when the receiver has not answered a fence request
FENCE_TIMEOUT_S = 5.0


def slot_data(inc: int, seq: int) -> np.ndarray:
    """A slot's bytes for batch `seq` of sender incarnation `inc`: 64-bit words that say whose
    they are (inc << 56 | seq << 16 | word index), so bytes that arrive wrong tell where they
    came from."""
    i = np.arange(SLOT // 8, dtype=np.uint64)
    return ((np.uint64(inc & 0xFF) << np.uint64(56)) | (np.uint64(seq) << np.uint64(16)) | i).view(np.uint8)


def explain(got: np.ndarray) -> str:
    """Whose words `got` (bytes that differ, at least 16) holds: tries the 8 alignments."""
    if not got.any():
        return "zeros"
    for k in range(8):
        w = got[k : k + 16]
        if len(w) < 16:
            break
        a, b = w.view(np.uint64).tolist()
        if b == a + 1 and (a & 0xFFFF) < SLOT // 8:
            return f"inc {a >> 56} seq {(a >> 16) & ((1 << 40) - 1)} word {a & 0xFFFF} (shift {k})"
    return "unrecognised: " + got[:24].tobytes().hex()


def make_ops(rng: random.Random, slot: int):
    """1..16 non-overlapping pieces inside `slot`, in a shuffled order on the remote side."""
    n = rng.randint(1, 16)
    sub = SLOT // n
    remote = list(range(n))
    rng.shuffle(remote)
    ops = []
    for i in range(n):
        size = rng.randint(1, sub)
        lo = i * sub + rng.randint(0, sub - size)
        ro = remote[i] * sub + rng.randint(0, sub - size)
        ops.append((slot * SLOT + lo, slot * SLOT + ro, size))
    return ops


class Base:
    def __init__(self, a, role: str, deadline_ms: float):
        self.a = a
        self.rep = Reporter(f"{a.pair}.{role}", a.inc, deadline_ms, 20000)
        self.sig = Signals(self.rep)
        self.key = f"{a.pair}.{role}.{a.run}.{a.inc}"
        self.engine = make_engine(self.rep, key=self.key, transports=["ucx"], listen_host=a.listen,
                                  connect_timeout_ms=3000, handshake_timeout_ms=3000)
        self.buf = np.zeros(SLOTS * SLOT, np.uint8)
        self.desc = self.engine.register_memory(self.buf)
        publish(a.rundir, f"{a.pair}.{role}", {"key": self.key, "inc": a.inc,
                                               "engine": self.engine.describe().pack().hex(),
                                               "mem": self.desc.pack().hex()})

    def close(self) -> None:
        self.rep.extra["in_flight_at_exit"] = len(self.engine.in_flight())
        self.engine.close()
        self.rep.stop_ticks()
        self.rep.emit("final")


class Receiver(Base):
    def __init__(self, a):
        super().__init__(a, "receiver", 5000)
        self.watch = Watch(a.rundir, f"{a.pair}.sender")
        self.sender = None
        self.last = {}  # slot -> (inc, seq) of the last batch checked OK there

    def run(self) -> None:
        self.rep.run_ticks()
        while not self.sig.quit:
            rec = self.watch.changed()
            if rec is not None:
                self.engine.add_peer(bytes.fromhex(rec["engine"]))
                self.sender = rec["key"]
            got = self.engine.pop_notifications()
            if not got:
                time.sleep(0.005)
            for sender, msg in got:
                self.handle(sender, msg)
        self.close()

    def handle(self, sender: str, msg) -> None:
        m = json.loads(msg)
        if "fence" in m:
            self.fence(sender, m["fence"])
            return
        name = f"{m['inc']}.{m['s']}"
        self.rep.start(name)
        want = slot_data(m["inc"], m["s"])
        bad = 0
        notes = []
        for j, (lo, ro, size) in enumerate(m["ops"]):
            x = lo - m["slot"] * SLOT
            diff = np.nonzero(self.buf[ro : ro + size] != want[x : x + size])[0]
            bad += len(diff)
            if len(diff):
                first, last = int(diff[0]), int(diff[-1])
                notes.append(f"op {j} of {len(m['ops'])} (size {size}, at {ro}): bytes {first}..{last} "
                             f"differ, {len(diff)} of them; they hold "
                             f"{explain(self.buf[ro + first : ro + last + 1])}")
            self.rep.count("verified_bytes", size)
        if bad:
            self.rep.count("corrupt_bytes", bad)
            prev = self.last.get(m["slot"])
            sys.stderr.write(f"soak: batch {name}: {bad} bytes differ (slot {m['slot']}, last checked "
                             f"there: {prev}, now {time.time():.3f}); " + "; ".join(notes) + "\n")
        else:
            self.last[m["slot"]] = (m["inc"], m["s"])
        self.rep.end(name, "CORRUPT" if bad else "OK")
        try:
            self.engine.notify(sender, json.dumps({"s": m["s"], "bad": bad}))
        except ferry.Error:
            self.rep.count("ack_failed")

    def fence(self, sender: str, n: int) -> None:
        """Ends the sender's connections, so that nothing of its failed batches lands after this
        (every earlier notification on them was checked above), then says so."""
        try:
            self.engine.fence_peer(sender, timeout_s=FENCE_TIMEOUT_S)
        except ferry.Error:
            self.rep.count("fence_failed")  # the sender asks again
            return
        self.rep.count("fences")
        # What arrived before the fence is checked before the sender may reuse a slot.
        for s2, msg in self.engine.pop_notifications():
            self.handle(s2, msg)
        try:
            self.engine.notify(sender, json.dumps({"fenced": n}))
        except ferry.Error:
            self.rep.count("ack_failed")


class Sender(Base):
    def __init__(self, a):
        super().__init__(a, "sender", XFER_DEADLINE_MS + ACK_DEADLINE_MS)
        self.watch = Watch(a.rundir, f"{a.pair}.receiver")
        self.rng = random.Random(f"{a.seed}/{a.pair}/sender/{a.inc}")
        self.session, self.peer_inc, self.peer_key, self.peer_mem = None, None, None, None
        self.dirty = set()  # slots of failed batches, free again once the receiver fenced
        self.fence_n, self.fence_at, self.fencing, self.fenced_n = 0, 0.0, set(), 0
        self.slot_free_at = [0.0] * SLOTS  # ms; inf while busy
        self.reqs = {}  # seq -> [transfer, slot, started, peer_inc, state]
        self.seq, self.next_ms = 0, 0.0

    def follow(self) -> None:
        rec = self.watch.changed()
        if rec is None:
            return
        try:
            self.engine.add_peer(bytes.fromhex(rec["engine"]))
            mem = ferry.MemoryDesc.unpack(bytes.fromhex(rec["mem"]))
            self.session = self.engine.open_session(self.desc, mem)
        except ferry.Error:
            self.rep.count("errors_raised")
            self.session = None
            return
        if self.peer_key and self.peer_key != rec["key"]:
            try:
                self.engine.remove_peer(self.peer_key)
            except ferry.Error:
                pass
        self.peer_key, self.peer_inc, self.peer_mem = rec["key"], rec["inc"], mem
        self.slot_free_at = [0.0] * SLOTS  # a fresh region: nothing old can land in it
        self.dirty, self.fencing, self.fence_at = set(), set(), 0.0
        self.rep.count("peers_learnt")

    def issue(self) -> None:
        t = now_ms()
        if self.rep.draining or self.session is None or t < self.next_ms or self.dirty or self.fencing:
            return  # while a fence is due, no new batch: its transfers would only fail
        slot = next((i for i, f in enumerate(self.slot_free_at) if f <= t), None)
        if slot is None:
            return
        self.next_ms = t + 1000.0 / self.a.rate
        self.seq += 1
        seq = self.seq
        self.buf[slot * SLOT : (slot + 1) * SLOT] = slot_data(self.a.inc, seq)
        ops = make_ops(self.rng, slot)
        note = json.dumps({"s": seq, "slot": slot, "inc": self.a.inc, "ops": ops})
        self.slot_free_at[slot] = float("inf")
        self.rep.start(str(seq))
        xfer = self.session.write_batch(np.array(ops, np.uint64), deadline_ms=XFER_DEADLINE_MS, notification=note)
        self.reqs[seq] = [xfer, slot, t, self.peer_inc, "xfer"]

    def release(self, entry) -> None:
        if entry[3] == self.peer_inc:
            self.slot_free_at[entry[1]] = 0.0

    def taint(self, entry) -> None:
        """The slot of a failed or unacknowledged batch: busy until the receiver fenced."""
        if entry[3] == self.peer_inc:
            self.dirty.add(entry[1])

    def fence(self) -> None:
        """Asks for a fence once every transfer has ended (so the fence ends no live batch)."""
        t = now_ms()
        if not (self.dirty or self.fencing) or self.peer_key is None:
            return
        if self.fencing and self.fenced_n == self.fence_n:
            return self.reopen()
        if any(e[4] == "xfer" for e in self.reqs.values()):
            return
        if self.fencing and t - self.fence_at < FENCE_RETRY_MS:
            return
        self.fence_n += 1
        self.fencing |= self.dirty
        self.dirty = set()
        self.fence_at = t
        try:
            self.engine.notify(self.peer_key, json.dumps({"fence": self.fence_n}))
            self.rep.count("fence_requests")
        except ferry.Error:
            self.rep.count("fence_request_failed")  # asked again after FENCE_RETRY_MS

    def fenced(self, n: int) -> None:
        if n == self.fence_n and self.fencing:  # else an answer to a request asked again since
            self.fenced_n = n
            self.reopen()

    def reopen(self) -> None:
        """After the fence: a new session on a new connection, then the slots are free. The old
        connection is seen closed (its control socket) a moment after the fence; a session
        opened before that would get the fenced connection again."""
        if self.session is not None and self.session.connected and now_ms() - self.fence_at < FENCE_RETRY_MS:
            return
        try:
            self.session = self.engine.open_session(self.desc, self.peer_mem)
        except ferry.Error:
            self.rep.count("errors_raised")
            return  # the slots stay busy; the next request fences again
        for slot in self.fencing:
            self.slot_free_at[slot] = 0.0
        self.fencing = set()

    def poll(self) -> None:
        for sender, msg in self.engine.pop_notifications():
            m = json.loads(msg)
            if "fenced" in m:
                self.fenced(m["fenced"])
                continue
            entry = self.reqs.get(m["s"])
            if entry is None:
                continue
            if entry[4] != "late":  # a late one's slot waits for the fence asked for it
                self.release(entry)
            if entry[4] != "late":  # an ack may overtake the sender's look at the transfer
                self.rep.end(str(m["s"]), "CORRUPT" if m["bad"] else "OK")
            del self.reqs[m["s"]]
        t = now_ms()
        for seq, entry in list(self.reqs.items()):
            xfer, state = entry[0], entry[4]
            if state == "xfer" and xfer.test():
                code = xfer.status()[0]
                if code == "OK":
                    entry[4] = "ack"
                else:
                    self.rep.end(str(seq), code)
                    self.taint(entry)
                    del self.reqs[seq]
                    sys.stderr.write(f"soak: batch {self.a.inc}.{seq} slot {entry[1]} failed {code} at "
                                     f"{time.time():.3f} (receiver #{entry[3]}, now #{self.peer_inc})\n")
            elif state == "ack" and t - entry[2] > ACK_DEADLINE_MS:
                self.rep.end(str(seq), "NO_ACK")  # its slot waits for a fence
                sys.stderr.write(f"soak: batch {self.a.inc}.{seq} slot {entry[1]} no ack at {time.time():.3f}\n")
                entry[4] = "late"
                self.taint(entry)
            elif state == "late" and (entry[3] != self.peer_inc or t - entry[2] > ACK_DEADLINE_MS + FENCE_RETRY_MS):
                del self.reqs[seq]

    def run(self) -> None:
        self.rep.run_ticks()
        while not self.sig.quit:
            self.follow()
            self.issue()
            self.poll()
            self.fence()
            time.sleep(0.002)
        self.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pair", required=True)
    p.add_argument("--role", choices=["sender", "receiver"], required=True)
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--rundir", required=True)
    p.add_argument("--run", default=str(os.getppid()))
    p.add_argument("--inc", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=40.0)
    a = p.parse_args()
    (Sender if a.role == "sender" else Receiver)(a).run()


if __name__ == "__main__":
    main()
