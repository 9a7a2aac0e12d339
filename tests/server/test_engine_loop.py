"""The engine loop (engine/loop.py) with a FAKE core, over both transports: in-process ZMQ
sockets as the server's engine process uses them, and the queues of `localradix.Engine`."""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time

import pytest
import zmq
from fake_engine_core import FakeCore

from localradix.config import ServerArgs
from localradix.engine.loop import CoreCall, EngineLoop, run_engine
from localradix.engine.transport import QueueTransport, ZmqTransport
from localradix.messages import (
    AbortRequest,
    Fatal,
    FlushCache,
    FlushDone,
    GenerateRequest,
    LoadFailed,
    Ready,
    RequestOutput,
    Shutdown,
    StepOutputs,
)
from localradix.sampling_params import SamplingParams

PARAMS = SamplingParams(max_new_tokens=3, temperature=0)


@pytest.fixture
def loop_sockets():
    ctx = zmq.Context()
    to_engine, engine_in = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    engine_out, from_engine = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    to_engine.bind("inproc://req")
    engine_in.connect("inproc://req")
    from_engine.bind("inproc://out")
    engine_out.connect("inproc://out")
    yield to_engine, engine_in, engine_out, from_engine
    for s in (to_engine, engine_in, engine_out, from_engine):
        s.close(linger=0)
    ctx.term()


def _events(sock, kind):
    out = []
    while sock.poll(0):
        event = pickle.loads(sock.recv())
        if isinstance(event, kind):
            out.append(event)
    return out


def _step_by_hand(loop: EngineLoop) -> None:
    for msg in loop.transport.receive(block=True):
        loop._handle(msg)
    if loop.core.has_work():
        loop.transport.send(StepOutputs(loop.core.step()))


def test_fake_engine_loop_runs_requests_aborts_flushes_and_stops(loop_sockets):
    to_engine, engine_in, engine_out, from_engine = loop_sockets
    core = FakeCore(ServerArgs())
    loop = EngineLoop(core, ZmqTransport(engine_in, engine_out, parent_pid=os.getppid()))
    to_engine.send(
        pickle.dumps(
            [
                GenerateRequest("a", (1, 2), PARAMS),
                GenerateRequest("b", (1, 2), PARAMS.replace(max_new_tokens=50)),
            ]
        )
    )
    for _ in range(5):
        _step_by_hand(loop)
    to_engine.send(pickle.dumps([AbortRequest("b")]))
    _step_by_hand(loop)
    outputs = [o for batch in _events(from_engine, StepOutputs) for o in batch.outputs]
    finals = {o.rid: o.finish_reason for o in outputs if o.finished}
    assert finals == {"a": "length", "b": "abort"}
    to_engine.send(pickle.dumps([FlushCache(), Shutdown()]))
    loop.run()  # handles the flush, then stops
    assert _events(from_engine, FlushDone) == [FlushDone(True)]


def test_sigterm_reads_as_shutdown(loop_sockets):
    _, engine_in, engine_out, _ = loop_sockets
    transport = ZmqTransport(engine_in, engine_out, parent_pid=os.getppid())
    transport.terminate()
    assert transport.receive(block=True) == [Shutdown()]


class _Collector:
    def __init__(self) -> None:
        self.events: list = []

    def __call__(self, event) -> None:
        self.events.append(event)


def test_queue_transport_announces_runs_answers_calls_and_stops():
    inbox: queue.Queue = queue.Queue()
    heard = _Collector()
    reply: queue.Queue = queue.Queue()
    inbox.put([GenerateRequest("a", (1, 2), PARAMS), CoreCall(lambda core: core.info.name, reply)])
    inbox.put([FlushCache()])  # refused: "a" is running
    worker = threading.Thread(
        target=run_engine, args=(lambda: FakeCore(ServerArgs()), QueueTransport(inbox, heard))
    )
    worker.start()
    assert reply.get(timeout=10) == (True, "fake-model")
    deadline = time.monotonic() + 10
    while not any(o.finished for o in _outputs(heard)) and time.monotonic() < deadline:
        time.sleep(0.01)
    inbox.put([Shutdown()])
    worker.join(10)
    assert not worker.is_alive()
    assert isinstance(heard.events[0], Ready) and heard.events[0].info.name == "fake-model"
    assert FlushDone(False) in heard.events
    assert [len(o.new_token_ids) for o in _outputs(heard)] == [1, 1, 1]
    assert _outputs(heard)[-1].finish_reason == "length"


def _outputs(heard: _Collector) -> list[RequestOutput]:
    return [o for e in list(heard.events) if isinstance(e, StepOutputs) for o in e.outputs]


def test_a_core_that_fails_to_load_or_crashes_tells_its_peer():
    def broken():
        raise OSError("no such model")

    heard = _Collector()
    assert not run_engine(broken, QueueTransport(queue.Queue(), heard))
    assert heard.events == [LoadFailed("OSError: no such model")]

    inbox: queue.Queue = queue.Queue()
    inbox.put([GenerateRequest("x", tuple(b"CRASH"), PARAMS)])  # the fake core raises in step
    heard = _Collector()
    assert not run_engine(lambda: FakeCore(ServerArgs()), QueueTransport(inbox, heard))
    assert isinstance(heard.events[-1], Fatal) and "fake engine crash" in heard.events[-1].message
