"""engine.metrics() (a dict and Prometheus text), engine.in_flight() and the metrics_port
endpoint, over the local transport."""

import socket
import urllib.request

import pytest

import ferry
from util import Pair


@pytest.fixture
def pair():
    p = Pair.make("local", 1 << 16)
    yield p
    p.close()


def series(m, kind, peer):
    found = [s for s in m["series"] if s["kind"] == kind and s["peer"] == peer]
    assert len(found) == 1
    return found[0]


def test_metrics_count_transfers_by_result(pair):
    for _ in range(3):
        assert pair.session.write(0, 0, 4096).wait()
    with pytest.raises(ferry.Error) as info:
        pair.session.write(0, 1 << 16, 1).wait()
    assert info.value.code == "OUT_OF_RANGE"
    pair.a.notify(pair.b.key, b"hi")

    m = pair.a.metrics()
    assert m["engine"] == pair.a.key
    s = series(m, "transfer", pair.b.key)
    assert s["transport"] == "local"
    assert s["results"] == {"OK": 3, "OUT_OF_RANGE": 1}
    assert s["bytes"] == 3 * 4096
    assert s["latency"]["count"] == 4
    assert sum(s["latency"]["counts"]) == 4
    assert len(s["latency"]["counts"]) == len(s["latency"]["bounds_seconds"]) + 1
    assert series(m, "notification", pair.b.key)["results"] == {"OK": 1}
    assert m["failures"]["out_of_range"] == 1
    assert m["failures"]["deadline"] == 0
    assert m["transfers_in_flight"] == 0
    assert m["peers"] == 1
    assert m["registered_bytes"] == 1 << 16
    assert pair.a.in_flight() == []

    text = pair.a.metrics(format="prometheus")
    labels = f'engine="{pair.a.key}",transport="local",peer="{pair.b.key}"'
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert samples[f'ferry_transfers_total{{{labels},result="OK"}}'] == "3"
    assert samples[f'ferry_transfer_seconds_count{{{labels}}}'] == "4"
    assert samples[f'ferry_failures_total{{engine="{pair.a.key}",cause="out_of_range"}}'] == "1"
    with pytest.raises(ValueError):
        pair.a.metrics(format="xml")


def test_metrics_endpoint_serves_prometheus_text():
    with ferry.Engine(transports=["local"], metrics_port=-1) as e:
        port = e.metrics_port_in_use
        assert port > 0
        e.notify(e.key, b"x")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200
            body = r.read().decode()
        assert f'ferry_notifications_total{{engine="{e.key}",transport="",peer="{e.key}",result="OK"}} 1' in body
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /nothing HTTP/1.0\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.0 404")
    with ferry.Engine(transports=["local"]) as e:
        assert e.metrics_port_in_use == 0
    with pytest.raises(ValueError):
        ferry.Engine(transports=["local"], metrics_port=-5)
