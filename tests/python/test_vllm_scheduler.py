"""ferry.vllm.FerryConnector's scheduler side alone (no memory, no engine): what it matches, the
metadata it builds for the workers (chunked prefill, prefix hits, aborts) and the
kv_transfer_params it hands the router."""

import pickle

import pytest

from ferry.vllm import FerryConnector, KVConnectorRole, Load, Save
from vllm_standin import (CachedRequestData, KVCacheBlocks, KVConnectorOutput, KVTransferConfig, ParallelConfig,
                          Request, RequestStatus, SchedulerOutput, VllmConfig)

BS = 16


def scheduler(mode="write", **extra):
    ktc = KVTransferConfig(engine_id="p0", kv_connector_extra_config={"mode": mode, "handshake_port": 7000,
                                                                      "handshake_host": "10.0.0.1", **extra})
    return FerryConnector(VllmConfig(ktc, parallel_config=ParallelConfig(tensor_parallel_size=2,
                                                                         data_parallel_rank=1)),
                          KVConnectorRole.SCHEDULER)


def meta_of(s, scheduled, cached=None):
    meta = s.build_connector_meta(SchedulerOutput(scheduled, cached or CachedRequestData()))
    return pickle.loads(pickle.dumps(meta))


FROM_P = {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_host": "10.0.0.1", "remote_port": 7002,
          "remote_tp_size": 2, "remote_dp_rank": 1, "remote_block_ids": [9, 8, 7, 6], "remote_num_tokens": 50,
          "transfer_id": "t1"}


def test_a_chunked_prefill_is_saved_in_its_last_chunk_and_handed_on():
    s = scheduler()
    req = Request("r", list(range(50)), {"do_remote_decode": True})
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, KVCacheBlocks([3, 4]), 0)
    assert meta_of(s, {"r": 32}).saves == []  # the first chunk: 32 of 50 tokens
    req.num_computed_tokens = 32
    meta = meta_of(s, {"r": 18}, CachedRequestData(["r"], [([5, 6],)]))
    assert meta.saves == [Save("r", "r", [3, 4, 5, 6], 50)]
    assert s.has_pending_push_work() is False
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    delay, params = s.request_finished(req, ([3, 4, 5, 6],))
    assert delay is True and s.has_pending_push_work() is True
    # Rank 0 of DP rank 1 serves on handshake_port + dp_rank * tp_size.
    assert params == {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "r",
                      "remote_engine_id": "p0", "remote_host": "10.0.0.1", "remote_port": 7002,
                      "remote_dp_rank": 1, "remote_tp_size": 2, "remote_block_ids": [3, 4, 5, 6],
                      "remote_num_tokens": 50, "ferry_mode": "write"}
    assert meta_of(s, {}).released == [("r", "r")]
    s.update_connector_output(KVConnectorOutput(finished_sending={"r"}))
    assert s.has_pending_push_work() is False


def test_an_aborted_prefill_is_aborted_on_the_workers_and_returns_no_params():
    s = scheduler()
    early = Request("early", list(range(20)), {"do_remote_decode": True, "transfer_id": "x"},
                    status=RequestStatus.FINISHED_ABORTED)
    s.update_state_after_alloc(early, KVCacheBlocks([1, 2]), 0)
    assert s.request_finished(early, [1, 2]) == (False, None)  # nothing was saved: free now
    late = Request("late", list(range(20)), {"do_remote_decode": True})
    s.update_state_after_alloc(late, KVCacheBlocks([3, 4]), 0)
    meta = meta_of(s, {"late": 20})
    assert meta.aborts == [("early", "x")] and [x.req_id for x in meta.saves] == ["late"]
    late.status = RequestStatus.FINISHED_ABORTED
    assert s.request_finished(late, [3, 4]) == (True, None)  # writes may be in flight: held
    meta = meta_of(s, {})
    assert meta.aborts == [("late", "late")] and meta.released == [("late", "late")]


@pytest.mark.parametrize("mode", ["write", "read"])
def test_a_decode_request_after_a_prefix_hit(mode):
    s = scheduler(mode)
    req = Request("d", list(range(50)), dict(FROM_P, ferry_mode=mode))
    # 16 tokens hit the local prefix cache; write loads the rest async, read all but the last token sync.
    want = (34, True) if mode == "write" else (33, False)
    assert s.get_num_new_matched_tokens(req, 16) == want
    assert s.get_num_new_matched_tokens(req, 16) == want  # free of side effects: asked again
    s.update_state_after_alloc(req, KVCacheBlocks([20, 21, 22, 23]), want[0])
    s.update_state_after_alloc(req, KVCacheBlocks([20, 21, 22, 23]), 0)  # the second call moves nothing
    (load,) = meta_of(s, {}).loads
    assert load == Load("d", "t1", [21, 22, 23], 16, want[0], "p0", 1, 2, "10.0.0.1", 7002, [9, 8, 7, 6], 50)
    assert req.kv_transfer_params["do_remote_prefill"] is False
    assert meta_of(s, {}).loads == []
    if mode == "write":  # aborted while loading: its blocks stay until the workers let go
        req.status = RequestStatus.FINISHED_ABORTED
        assert s.request_finished(req, [20, 21, 22, 23]) == (True, None)
        assert meta_of(s, {}).aborts == [("d", "t1")] and s.has_pending_push_work()


def test_a_full_prefix_hit_only_tells_p_and_bad_params_are_computed_here():
    s = scheduler("write")
    req = Request("d", list(range(32)), dict(FROM_P))
    assert s.get_num_new_matched_tokens(req, 32) == (0, False)
    s.update_state_after_alloc(req, KVCacheBlocks([5, 6]), 0)
    (load,) = meta_of(s, {}).loads
    assert load.notify_only and load.blocks == []
    assert s.request_finished(req, [5, 6]) == (False, None)
    for params in ({"do_remote_prefill": True}, dict(FROM_P, remote_port="x"), dict(FROM_P, ferry_mode="read")):
        req = Request("bad", list(range(32)), params)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False), params


def test_the_mode_is_checked():
    with pytest.raises(ValueError, match="mode must be 'write' or 'read'"):
        scheduler("push")
    assert FerryConnector.requires_piecewise_for_cudagraph({}) is True
    assert FerryConnector.get_required_kvcache_layout(None) is None
