"""Addresses as "host:port" with IPv4, [IPv6] or a name: the ucx transport's listener and its
peers' dialing (src/base/host_port.*)."""

import socket

import numpy as np
import pytest

import ferry
from util import fresh_key


def _need_ucx():
    if "ucx" not in ferry.system_info()["transports_usable"]:
        pytest.skip("ucx is not usable here")


def _ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_ucx_transfer_over_ipv6_loopback(host):
    _need_ucx()
    _ipv6_loopback()
    src = np.arange(8192, dtype=np.uint8)
    dst = np.zeros(8192, np.uint8)
    with ferry.Engine(key=fresh_key("v6a"), transports=["ucx"], listen_host=host) as a, ferry.Engine(
        key=fresh_key("v6b"), transports=["ucx"], listen_host=host
    ) as b:
        am, bm = a.register_memory(src), b.register_memory(dst)
        a.add_peer(b.describe().pack())
        session = a.open_session(am, ferry.MemoryDesc.unpack(bm.pack()))
        assert session.write(0, 0, 8192).wait()
        assert (src == dst).all()


def test_ucx_listens_on_a_name():
    _need_ucx()
    with ferry.Engine(key=fresh_key("name"), transports=["ucx"], listen_host="localhost"):
        pass


@pytest.mark.parametrize("host", ["bad host", "1.2.3", "[::1", "::1]"])
def test_ucx_refuses_a_bad_listen_host(host):
    _need_ucx()
    with pytest.raises(ferry.InvalidArgumentError, match="listen_host"):
        ferry.Engine(key=fresh_key("bad"), transports=["ucx"], listen_host=host)
