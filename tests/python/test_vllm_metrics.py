"""FerryConnector's Prometheus metrics (build_prom_metrics): made through the metric classes vLLM
hands in, one labelled child per engine, fed the connector stats the steps aggregate."""

import types

import pytest

from ferry.vllm import FerryConnector, FerryKVConnectorStats


class _Metric:
    made = []

    def __init__(self, name, documentation, labelnames, buckets=None):
        self.name, self.documentation, self.labelnames, self.buckets = name, documentation, labelnames, buckets
        self.children = {}
        _Metric.made.append(self)

    def labels(self, *values):
        assert len(values) == len(self.labelnames)
        return self.children.setdefault(values, _Child())


class _Child:
    def __init__(self):
        self.observed, self.total = [], 0

    def observe(self, v):
        self.observed.append(v)

    def inc(self, n=1):
        assert n >= 0
        self.total += n

    def set(self, v):
        self.total = v


class Gauge(_Metric):
    pass


class Counter(_Metric):
    pass


class Histogram(_Metric):
    pass


def make(engines=2):
    _Metric.made = []
    config = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_connector="FerryConnector"))
    labels = {i: ["model-x", str(i)] for i in range(engines)}
    return FerryConnector.build_prom_metrics(config, {Gauge: Gauge, Counter: Counter, Histogram: Histogram},
                                             ["model_name", "engine"], labels)


def test_metrics_follow_the_nixl_schema_with_ferry_names():
    m = make()
    names = sorted(x.name for x in _Metric.made)
    assert names == ["vllm:ferry_bytes_transferred", "vllm:ferry_num_failed_transfers",
                     "vllm:ferry_num_kv_expired_blocks", "vllm:ferry_num_successful_transfers",
                     "vllm:ferry_xfer_time_seconds"]
    hist = next(x for x in _Metric.made if x.name == "vllm:ferry_xfer_time_seconds")
    assert isinstance(hist, Histogram) and hist.buckets == sorted(hist.buckets)
    assert all(x.labelnames == ["model_name", "engine"] for x in _Metric.made)
    assert set(m.xfer_time) == {0, 1}  # a child per engine


def test_observe_feeds_the_aggregated_stats_to_that_engine_only():
    m = make()
    a = FerryKVConnectorStats()
    a.data.update(num_successful_transfers=2, bytes_transferred=4096, transfer_ms=[1.5, 30.0])
    b = FerryKVConnectorStats()
    b.data.update(num_failed_transfers=1, num_kv_expired_blocks=3, transfer_ms=[250.0])
    a.aggregate(b)  # what vLLM does over a step's workers
    m.observe(a.data, engine_idx=1)
    assert m.xfer_time[1].observed == pytest.approx([0.0015, 0.030, 0.250])
    assert m.xfer_time[0].observed == []
    totals = {k: v[1].total for k, v in m.counters.items()}
    assert totals == {"num_successful_transfers": 2, "num_failed_transfers": 1, "bytes_transferred": 4096,
                      "num_kv_expired_blocks": 3}
    assert all(v[0].total == 0 for v in m.counters.values())
    m.observe(FerryKVConnectorStats().data, engine_idx=1)  # an empty step changes nothing
    assert m.counters["bytes_transferred"][1].total == 4096


def test_metric_types_by_name_work_too():
    _Metric.made = []
    config = types.SimpleNamespace(kv_transfer_config=None)
    m = FerryConnector.build_prom_metrics(config, {"Gauge": Gauge, "Counter": Counter, "Histogram": Histogram},
                                          ["engine"], {0: ["0"]})
    m.observe({"num_successful_transfers": 1, "transfer_ms": [2.0]}, 0)
    assert m.counters["num_successful_transfers"][0].total == 1
