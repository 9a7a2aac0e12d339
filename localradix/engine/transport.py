"""The engine loop's two transports: ZMQ sockets (the server's engine process) and in-process
queues (`localradix.Engine`).

ZMQ wire format (pickled; the API process binds both sockets, the engine process connects):
requests arrive as lists of messages, each event leaves as one pickled `EngineEvent`.
"""

from __future__ import annotations

import os
import pickle
import queue
from collections.abc import Callable
from typing import Any

import zmq

from localradix.messages import EngineEvent, Shutdown

IDLE_POLL_MS = 100  # an idle engine process wakes this often to check on the API process


class ZmqTransport:
    feeds_stats = True

    def __init__(self, pull: zmq.Socket, push: zmq.Socket, parent_pid: int) -> None:
        self.pull = pull
        self.push = push
        self.parent_pid = parent_pid
        self._terminated = False

    def terminate(self) -> None:
        """SIGTERM: the loop reads a Shutdown next (it finishes the step it is in)."""
        self._terminated = True

    def receive(self, block: bool) -> list[Any]:
        if self._terminated:
            return [Shutdown()]
        if not self.pull.poll(IDLE_POLL_MS if block else 0):
            return []
        messages: list[Any] = []
        while True:
            try:
                messages.extend(pickle.loads(self.pull.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return messages

    def send(self, event: EngineEvent) -> None:
        self.push.send(pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL))

    def peer_alive(self) -> bool:
        return os.getppid() == self.parent_pid


class QueueTransport:
    """Lists of messages in through a queue; events out through a callback run on the loop's thread
    (it must be quick: hand the event on, never work on it there)."""

    feeds_stats = False  # `Engine.stats()` asks when it wants a snapshot

    def __init__(
        self, inbox: queue.Queue[list[Any]], on_event: Callable[[EngineEvent], None]
    ) -> None:
        self.inbox = inbox
        self.on_event = on_event

    def receive(self, block: bool) -> list[Any]:
        """Each inbox item is a list of messages, as on the wire: requests sent together (the
        forks of one request) reach the scheduler in the same step."""
        messages: list[Any] = []
        try:
            messages.extend(self.inbox.get(block=block))
            while True:
                messages.extend(self.inbox.get_nowait())
        except queue.Empty:
            return messages

    def send(self, event: EngineEvent) -> None:
        self.on_event(event)

    def peer_alive(self) -> bool:
        return True  # the Engine's owner ends the loop with Shutdown (or the thread dies with it)
