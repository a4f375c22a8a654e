"""The nemesis: carries a schedule (``chaos.schedule``) out on the nodes, in time, recording
each step (``FaultRecord``), and heals everything at the end.

Each node's process faults run in a lane of their own (a thread, in the schedule's order),
so a slow restart of one node does not hold the others' faults back; partitions run on the
schedule's thread. Partitions are kept as the set of directed blocks wanted ("a drops b's
traffic"); a block that could not be set (the node down or paused) or was lost (a restart
empties the blocklist) is set again at every later step, so a node killed while cut off
comes back cut off until the partition ends.
"""

from __future__ import annotations

import queue
import threading
import time

from chaos.history import FaultRecord, History
from chaos.nodes import ChaosNodes
from chaos.schedule import (
    DISK,
    KILL,
    ONEWAY,
    PARTITION_KINDS,
    PAUSE,
    SKEW,
    SKEW_FAR,
    Action,
    Fault,
    actions,
)


class Nemesis:
    def __init__(self, nodes: ChaosNodes, history: History, faults: list[Fault], t0: float) -> None:
        self.nodes, self.history, self.t0 = nodes, history, t0
        self.steps = actions(faults)
        self.wanted: set[tuple[int, int]] = set()  # (a, b): a drops b's traffic
        self.applied: set[tuple[int, int]] = set()
        self.down: set[int] = set()
        self.active: list[Fault] = []
        self._lock = threading.Lock()  # the block sets and ``active``: the lanes share them

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _record(
        self, fault: Fault, node: int, action: str, ok: bool = True, detail: str = ""
    ) -> None:
        self.history.add_fault(FaultRecord(self._now(), node, action, fault.kind, ok, detail))

    def run(self, stop: threading.Event) -> None:
        lanes: dict[int, queue.SimpleQueue[Action | None]] = {}
        threads = []
        for step in self.steps:
            if stop.wait(max(0.0, step.at_s - self._now())):
                break
            if step.fault.kind in PARTITION_KINDS:
                self.do(step)
                continue
            if step.fault.node not in lanes:
                lane: queue.SimpleQueue[Action | None] = queue.SimpleQueue()
                lanes[step.fault.node] = lane
                threads.append(threading.Thread(target=self._lane, args=(lane, stop), daemon=True))
                threads[-1].start()
            lanes[step.fault.node].put(step)
        for lane in lanes.values():
            lane.put(None)
        for thread in threads:
            thread.join()

    def _lane(self, steps: queue.SimpleQueue[Action | None], stop: threading.Event) -> None:
        while (step := steps.get()) is not None:
            if not stop.is_set():
                self.do(step)

    def do(self, step: Action) -> None:
        fault = step.fault
        try:
            if fault.kind in PARTITION_KINDS:
                self._partition(fault, step.begin)
            elif step.begin:
                self._begin(fault)
            else:
                self._end(fault)
        except Exception as exc:  # a failed step is recorded; the run goes on
            self._record(fault, fault.node, "error", False, f"{type(exc).__name__}: {exc}")
        with self._lock:
            if step.begin:
                self.active.append(fault)
            elif fault in self.active:
                self.active.remove(fault)
            self._set_blocks()

    def _begin(self, fault: Fault) -> None:
        i = fault.node
        if fault.kind == KILL:
            self.nodes.kill(i)
            self.down.add(i)
            self._record(fault, i, "kill")
        elif fault.kind == PAUSE:
            self.nodes.pause(i)
            self._record(fault, i, "pause")
        elif fault.kind in (SKEW, SKEW_FAR):
            self.nodes.set_config(i, "clock_offset_ms", fault.offset_ms)
            self._restart(fault, f"skew {fault.offset_ms:+d}")
        elif fault.kind == DISK:
            self._record(fault, i, "fill", detail=self.nodes.fill_disk(i))
            self._forget_blocks_if_restarted(i)

    def _end(self, fault: Fault) -> None:
        i = fault.node
        if fault.kind == KILL:
            self._restart(fault, "restart")
            self.down.discard(i)
        elif fault.kind == PAUSE:
            self.nodes.resume(i)
            self._record(fault, i, "resume")
        elif fault.kind in (SKEW, SKEW_FAR):
            self.nodes.set_config(i, "clock_offset_ms", None)
            self._restart(fault, "unskew")
        elif fault.kind == DISK:
            self._record(fault, i, "free", detail=self.nodes.free_disk(i))
            self._forget_blocks_if_restarted(i)

    def _restart(self, fault: Fault, action: str) -> None:
        self.nodes.restart(fault.node)
        self._forget_blocks(fault.node)
        self._record(fault, fault.node, action)

    def _forget_blocks_if_restarted(self, i: int) -> None:
        if not self.nodes.tmpfs:  # the disk fallback restarts the node
            self._forget_blocks(i)

    def _forget_blocks(self, i: int) -> None:
        with self._lock:
            self.applied = {(a, b) for a, b in self.applied if a != i}

    def _partition(self, fault: Fault, begin: bool) -> None:
        group = set(fault.group)
        rest = [n for n in range(self.nodes.count) if n not in group]
        pairs = {(a, b) for a in group for b in rest}
        if fault.kind != ONEWAY:
            pairs |= {(b, a) for a, b in pairs}
        with self._lock:
            if begin:
                self.wanted |= pairs
            else:
                self.wanted -= pairs
        self._record(
            fault, fault.node, "cut" if begin else "heal", detail=f"{sorted(group)} | {rest}"
        )

    def _set_blocks(self) -> None:
        for a, b in sorted(self.wanted - self.applied):
            if self.nodes.switch(a, b, block=True):
                self.applied.add((a, b))
        for a, b in sorted(self.applied - self.wanted):
            if self.nodes.switch(a, b, block=False) or not self.nodes.alive(a):
                self.applied.discard((a, b))

    def heal(self) -> None:
        """End every fault still on (in reverse), then make sure no node blocks another."""
        for fault in reversed(list(self.active)):
            self.do(Action(self._now(), False, fault))
        for i in range(self.nodes.count):
            self.nodes.resume(i)
            if not self.nodes.alive(i):
                self.nodes.cluster.restart(i)
        self.wanted.clear()
        for a in range(self.nodes.count):
            for b in range(self.nodes.count):
                if a != b:
                    self.nodes.switch(a, b, block=False)
        self.applied.clear()
