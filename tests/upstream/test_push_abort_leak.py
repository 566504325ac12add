"""Under NIXL's push mode, when the prefill instance never writes a registered request's KV
(it failed or restarted after the registration reached it, or its lease on the blocks ran out),
nothing on the decode instance ends the receive: the request waits in ``WAITING_FOR_REMOTE_KVS``
for as long as the engine runs, and once the client aborts it its blocks are never freed.

Run against vLLM's real ``Scheduler`` and the real scheduler side of ``NixlPushConnector`` on CPU
(no NIXL library is needed on that side).  The decode instance (D) admits a request whose KV the
prefill instance (P) will push: D allocates its blocks, puts the request in
``WAITING_FOR_REMOTE_KVS`` and hands the worker a registration to send to P.  Then the client goes
away and D aborts the request.  P never writes: D's push worker reports a receive only when P's
completion notification arrives, or when sending the registration fails (no handshake, no agent),
so it reports nothing, done or failed.  These tests stand in for that worker: it reports nothing
for the request.

- D's ``Scheduler.finish_requests`` delays the free of a request aborted in
  ``WAITING_FOR_REMOTE_KVS`` until the worker reports its receive (``finished_recving``);
- the push connector's ``request_finished`` on D asks for nothing and tells the worker nothing;
- its registration watchdog (``push_registration_timeout``), which the module says "fails requests
  that have been registered but not fulfilled", drops the deadline and the pending registration,
  logs a warning, and fails nothing and frees nothing.

So the blocks stay allocated and the request stays in ``Scheduler.requests``.  The control test
shows the one way out: a worker report of the receive frees them.
"""

from __future__ import annotations

import time

import pytest
from upstream_vllm import VLLM_VERSION, full, known_affected, model_runner_output, request, scheduler, vllm_config
from vllm.config import KVTransferConfig, VllmConfig
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

push = pytest.importorskip(
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler",
    reason=f"vLLM {VLLM_VERSION} has no NIXL push mode",
)

WATCHDOG_S = 0.05  # push_registration_timeout: short, so the watchdog fires within the test
PROMPT = 64  # four blocks of 16


def push_decode_config() -> VllmConfig:
    base = vllm_config()
    transfer = KVTransferConfig(
        kv_connector="NixlPushConnector",
        kv_role="kv_consumer",
        kv_connector_extra_config={"push_registration_timeout": WATCHDOG_S},
    )
    return VllmConfig(
        model_config=base.model_config,
        cache_config=base.cache_config,
        scheduler_config=base.scheduler_config,
        device_config=base.device_config,
        kv_transfer_config=transfer,
    )


def remote_prefill_request(rid: str):
    req = request(rid, PROMPT)
    req.kv_transfer_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-0",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_request_id": "p-" + rid,
        "tp_size": 1,
    }
    return req


def worker_reports(sched: Scheduler, out: SchedulerOutput, finished_recving: set[str] | None = None) -> None:
    """The step's model-runner output: no tokens, and the receives the worker reports done."""
    kv = KVConnectorOutput(finished_recving=finished_recving or set())
    sched.update_from_output(out, model_runner_output([], [], kv))


def admit(sched: Scheduler) -> int:
    """D admits ``d1``, allocates its blocks and hands its registration to the worker; the worker
    reports nothing.  The blocks it took."""
    pool = sched.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    sched.add_request(remote_prefill_request("d1"))
    out = sched.schedule()
    assert sched.requests["d1"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert "d1" in out.kv_connector_metadata.push_registrations  # the worker sends it to P
    worker_reports(sched, out)
    return free_before - pool.get_num_free_blocks()


def steps_past_the_watchdog(sched: Scheduler, report_recv: bool = False) -> None:
    time.sleep(2 * WATCHDOG_S)
    for i in range(3):
        out = sched.schedule()
        worker_reports(sched, out, {"d1"} if report_recv and i == 0 else None)
    # The watchdog has fired: no deadline is left for the request.
    assert "d1" not in sched.connector.connector_scheduler._push_registration_deadlines


@pytest.mark.xfail(
    known_affected("push-receive-never-ends"),
    reason="the push watchdog fails no registration P never fulfils",
    strict=True,
)
def test_watchdog_ends_a_receive_p_never_writes():
    sched = scheduler(full(), config=push_decode_config())
    admit(sched)
    steps_past_the_watchdog(sched)
    assert sched.requests["d1"].status != RequestStatus.WAITING_FOR_REMOTE_KVS, (
        "the request still waits for KV that will never come after the watchdog fired"
    )


def abort_while_waiting(report_recv: bool) -> tuple[Scheduler, int, int]:
    """D admits the request, the client aborts it while D waits for P's push, the watchdog's
    deadline passes; the worker reports the receive only if ``report_recv``.  (Free blocks before
    the request, free blocks at the end, blocks the request took.)"""
    sched = scheduler(full(), config=push_decode_config())
    pool = sched.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    assert admit(sched) == PROMPT // 16
    sched.finish_requests("d1", RequestStatus.FINISHED_ABORTED)
    steps_past_the_watchdog(sched, report_recv)
    return sched, free_before, pool.get_num_free_blocks()


@pytest.mark.xfail(
    known_affected("push-receive-never-ends"),
    reason="an aborted push-mode receive that P never writes holds D's blocks",
    strict=True,
)
def test_aborted_push_receive_frees_its_blocks_once_the_watchdog_fires():
    sched, free_before, free_after = abort_while_waiting(report_recv=False)
    assert free_after == free_before, (
        f"{free_before - free_after} blocks still held by the aborted request after the watchdog fired"
    )
    assert "d1" not in sched.requests


def test_control_a_reported_receive_frees_the_aborted_requests_blocks():
    """The same abort, but the worker reports the receive: vLLM frees the blocks then."""
    sched, free_before, free_after = abort_while_waiting(report_recv=True)
    assert free_after == free_before
    assert "d1" not in sched.requests
