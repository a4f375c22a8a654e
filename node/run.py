"""``chatsync node run``: one node in the foreground until SIGINT or SIGTERM.

``run_node`` raises ``StartupRefused`` bare, out of trio's exception groups, when the node
will not start; the CLI prints it as one line."""

from __future__ import annotations

import gc
import logging
import signal

import trio

from node.config import NodeConfig
from node.errors import StartupRefused
from node.memory import trim_heap_periodically, tune_allocator
from node.node import Node

SLOW_SHUTDOWN_S = 10.0


async def run_until_signalled(config: NodeConfig) -> None:
    node = Node(config)
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            running = await nursery.start(node.run)
            freeze_startup_heap()
            trio.lowlevel.spawn_system_task(trim_heap_periodically)
            print(f"peer id {running.peer_id}", flush=True)
            for address in running.listen_addrs:
                print(f"listening {address}", flush=True)
            print(f"http {config.http}", flush=True)
            async for signum in signals:
                logging.getLogger(__name__).info("signal %s: stopping", signum)
                node.stop()
                trio.lowlevel.spawn_system_task(_report_slow_shutdown)
                break


def freeze_startup_heap() -> None:
    """Move everything start-up made (imported modules, libp2p, FastAPI, the caches' first
    fill) out of the cyclic GC's sight. Every full collection walked all of it: ~70 ms with
    the event loop stopped, in each node at about the same time under load — the worst
    latencies of ``chatsync bench gossip``. It lives as long as the process anyway."""
    gc.collect()
    gc.freeze()


async def _report_slow_shutdown() -> None:
    """Log what still runs if stopping takes long (a system task: it ends with the program)."""
    await trio.sleep(SLOW_SHUTDOWN_S)
    log = logging.getLogger(__name__)
    log.warning("still stopping after %.0f s; tasks left:", SLOW_SHUTDOWN_S)
    for line in task_tree(trio.lowlevel.current_root_task()):
        log.warning("  %s", line)


def task_tree(task: trio.lowlevel.Task, depth: int = 0) -> list[str]:
    """One line per task under ``task``: its name, its function and where it waits (the
    innermost frames)."""
    frames = []
    awaiting: object = task.coro
    while awaiting is not None:
        frame = getattr(awaiting, "cr_frame", None) or getattr(awaiting, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        awaiting = getattr(awaiting, "cr_await", None) or getattr(awaiting, "gi_yieldfrom", None)
    shown = frames if len(frames) <= 4 else [frames[0], "...", *frames[-3:]]
    lines = ["  " * depth + f"{task.name} @ {' > '.join(shown)}"]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            lines += task_tree(child, depth + 1)
    return lines


def run_node(config: NodeConfig, log_level: str = "INFO") -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("libp2p", "hypercorn", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(
            logging.WARNING if log_level != "DEBUG" else logging.DEBUG
        )
    tune_allocator()
    try:
        trio.run(run_until_signalled, config)
    except BaseExceptionGroup as group:
        refused = startup_refusal(group)
        if refused is None:
            raise
        raise refused from None


def startup_refusal(group: BaseExceptionGroup[BaseException]) -> StartupRefused | None:
    """The ``StartupRefused`` that ``Node.run`` raised, if that is all ``group`` holds (trio's
    nurseries wrap it in groups)."""
    matched, rest = group.split(StartupRefused)
    if matched is None or rest is not None:
        return None
    refused: BaseException = matched
    while isinstance(refused, BaseExceptionGroup):
        refused = refused.exceptions[0]
    return refused if isinstance(refused, StartupRefused) else None
