#!/usr/bin/env python3
"""What the soak found, and what ferry does about it now: a ucx Engine created while its
host's network link is down used to be created without error and then refuse every connection
for the rest of its life ("opening an endpoint back to B: ucp_ep_create: Destination is
unreachable"): UCX enumerates its network devices when the engine's context is made, and with
the link down the only TCP device is lo. Engine::Create now refuses it (UNAVAILABLE, naming the
interface); A retries until its link is up, as a supervisor would.

    sudo PYTHONPATH=build/release/python python3 tests/soak/repro_ucx_link_down.py

Exit status: 0 when A was refused while its link was down and B reaches A once it is up, 1
otherwise, 77 when it cannot run here (not root, no namespaces).
"""

import os
import subprocess
import sys
import tempfile
import time

A_SIDE = r'''
import os, sys, time, numpy as np, ferry
d = sys.argv[1]
refused = 0
while True:
    try:
        e = ferry.Engine(key="A", transports=["ucx"], listen_host="10.9.0.1")
        break
    except ferry.Error as err:
        if "UNAVAILABLE" not in str(err) and getattr(err, "code", "") != "UNAVAILABLE":
            raise
        if refused == 0:
            open(f"{d}/a.refused", "w").write(str(err))
        refused += 1
        time.sleep(0.2)
buf = np.zeros(4096, np.uint8)
mem = e.register_memory(buf)
open(f"{d}/a.mem", "wb").write(mem.pack())
open(f"{d}/a.tmp", "wb").write(e.describe().pack())
os.replace(f"{d}/a.tmp", f"{d}/a.desc")
time.sleep(60)
'''

B_SIDE = r'''
import sys, time, numpy as np, ferry
d = sys.argv[1]
e = ferry.Engine(key="B", transports=["ucx"], listen_host="10.9.0.2")
buf = np.full(4096, 7, np.uint8)
mem = e.register_memory(buf)
e.add_peer(open(f"{d}/a.desc", "rb").read())
for attempt in range(5):
    try:
        s = e.open_session(mem, ferry.MemoryDesc.unpack(open(f"{d}/a.mem", "rb").read()))
        ok = s.write(0, 0, 16, deadline_ms=5000).wait(6000)
        print(f"B: attempt {attempt}: session and write to A: {ok}")
        sys.exit(0 if ok else 1)
    except ferry.Error as x:
        print(f"B: attempt {attempt}: {x.code}: {x.message}")
        time.sleep(3)
sys.exit(1)
'''


def sh(cmd):
    return subprocess.call(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    if os.geteuid() != 0:
        print("skipped: needs root (network namespaces)")
        return 77
    pid = os.getpid()
    na, nb, va, vb = f"frep{pid}a", f"frep{pid}b", f"fr{pid}a", f"fr{pid}b"
    d = tempfile.mkdtemp(prefix="ferry-repro-")
    a = None
    try:
        setup = [f"ip netns add {na}", f"ip netns add {nb}", f"ip link add {va} type veth peer name {vb}",
                 f"ip link set {va} netns {na}", f"ip link set {vb} netns {nb}",
                 f"ip -n {na} addr add 10.9.0.1/24 dev {va}", f"ip -n {nb} addr add 10.9.0.2/24 dev {vb}",
                 f"ip -n {na} link set lo up", f"ip -n {nb} link set lo up", f"ip -n {nb} link set {vb} up"]
        if any(sh(c) for c in setup):
            print("skipped: cannot create network namespaces and a veth pair here")
            return 77
        # A starts while its link is down: its engine must be refused ...
        a = subprocess.Popen(["ip", "netns", "exec", na, sys.executable, "-c", A_SIDE, d])
        deadline = time.monotonic() + 30
        while not os.path.exists(f"{d}/a.refused"):
            if os.path.exists(f"{d}/a.desc"):
                print("A: engine created with its link down (the old behaviour)")
                return 1
            if a.poll() is not None or time.monotonic() > deadline:
                print(f"A exited ({a.poll()}) or timed out before it was refused")
                return 1
            time.sleep(0.1)
        print("A: refused while its link is down: " + open(f"{d}/a.refused").read().strip())
        # ... then the link comes up, A's retry succeeds, and B reaches it.
        sh(f"ip -n {na} link set {va} up")
        print(f"link of {na} up")
        while not os.path.exists(f"{d}/a.desc"):
            if a.poll() is not None or time.monotonic() > deadline + 30:
                print(f"A exited ({a.poll()}) or timed out before it published its descriptor")
                return 1
            time.sleep(0.1)
        rc = subprocess.call(["ip", "netns", "exec", nb, sys.executable, "-c", B_SIDE, d])
        print("B could not reach A" if rc else "B reached A once A's link was up")
        return 1 if rc else 0
    finally:
        if a is not None:
            a.kill()
            a.wait()
        sh(f"ip netns del {na}")
        sh(f"ip netns del {nb}")
        subprocess.call(["rm", "-rf", d])


if __name__ == "__main__":
    sys.exit(main())
