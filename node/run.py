"""``chatsync node run``: one node in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import logging
import signal

import trio

from node.config import NodeConfig
from node.node import Node


async def run_until_signalled(config: NodeConfig) -> None:
    node = Node(config)
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await nursery.start(node.run)
            print(f"peer id {node.peer_id}", flush=True)
            for address in node.listen_addrs:
                print(f"listening {address}", flush=True)
            print(f"http {config.http}", flush=True)
            async for signum in signals:
                logging.getLogger(__name__).info("signal %s: stopping", signum)
                node.stop()
                break


def run_node(config: NodeConfig, log_level: str = "INFO") -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("libp2p", "hypercorn", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(
            logging.WARNING if log_level != "DEBUG" else logging.DEBUG
        )
    trio.run(run_until_signalled, config)
