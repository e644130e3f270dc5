"""Prometheus metrics of ferry's vLLM connector (``FerryConnector.build_prom_metrics``).

vLLM's front end builds one of these per API server and feeds it the connector stats that
every step aggregates (``FerryKVConnectorStats.data``). The names follow the schema NIXL's and
MoRIIO's connectors export (``vllm:nixl_*``, ``vllm:moriio_*``), with ``ferry`` in their place,
so a dashboard built for those reads ferry's:

- ``vllm:ferry_xfer_time_seconds`` (histogram): each load, from start to its last layer
- ``vllm:ferry_num_successful_transfers``, ``vllm:ferry_num_failed_transfers`` (counters)
- ``vllm:ferry_bytes_transferred`` (counter): bytes moved by this instance's engines
- ``vllm:ferry_num_kv_expired_blocks`` (counter): blocks handed back after the abort timeout
  with no confirmation: a peer that went silent, kept apart from transfer failures (a lease
  expiry is a signal for the operator, not a network fault)
"""

try:  # vLLM's base class where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics as _PromBase
except ImportError:  # pragma: no cover - depends on the environment
    class _PromBase:
        """The part of vLLM's KVConnectorPromMetrics the connector relies on: metric classes by
        kind (``metric_types`` maps prometheus_client's Gauge, Counter and Histogram, or their
        names, to the classes to make), labels, and one labelled child per engine."""

        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            def pick(kind):
                for k, v in metric_types.items():
                    if getattr(k, "__name__", k) == kind:
                        return v
                raise KeyError(f"metric_types has no {kind}")
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            self._gauge_cls, self._counter_cls, self._histogram_cls = pick("Gauge"), pick("Counter"), pick("Histogram")
            self._labelnames = labelnames
            self._per_engine_labelvalues = per_engine_labelvalues

        def make_per_engine(self, metric):
            return {idx: metric.labels(*values) for idx, values in self._per_engine_labelvalues.items()}

# Seconds: 1 ms to 100 s, as wide as a KV load of a long prompt over a slow link can take.
XFER_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 100.0]


class FerryPromMetrics(_PromBase):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.xfer_time = self.make_per_engine(self._histogram_cls(
            name="vllm:ferry_xfer_time_seconds", documentation="KV load time (start to last layer) over ferry",
            buckets=XFER_BUCKETS, labelnames=labelnames))
        counters = {
            "num_successful_transfers": "KV loads over ferry that completed",
            "num_failed_transfers": "KV loads over ferry that failed (their blocks are recomputed)",
            "bytes_transferred": "bytes ferry's engines moved",
            "num_kv_expired_blocks": "KV blocks handed back after the abort timeout with no confirmation",
        }
        self.counters = {key: self.make_per_engine(self._counter_cls(
            name=f"vllm:ferry_{key}", documentation=doc, labelnames=labelnames)) for key, doc in counters.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        """Feeds one step's aggregated stats (FerryKVConnectorStats.data) of engine `engine_idx`."""
        for ms in transfer_stats_data.get("transfer_ms", []):
            self.xfer_time[engine_idx].observe(float(ms) / 1000.0)
        for key, per_engine in self.counters.items():
            n = transfer_stats_data.get(key, 0)
            if n:
                per_engine[engine_idx].inc(n)
