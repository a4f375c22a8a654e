"""The run's node processes: a ``cluster.local.Cluster`` (durable by default) with what the
nemesis does to them — kill -9, SIGSTOP/SIGCONT, the admin partition switch per direction,
a restart with another config (a skewed clock), a disk filled to refusal — and, after the
run, each node's final state read from its RocksDB directory (``NodeState``).

Disks: each node's data directory is a tmpfs mount of ``disk_mb`` (when ``mount -t tmpfs``
is allowed: root, or a user namespace); filling it leaves less than the node's
``min_free_disk_mb``, so the node refuses writes (``node/limits.py`` ``check_free_disk``)
until the ballast goes. Without tmpfs, a fill restarts the node with a ``min_free_disk_mb``
beyond the free space instead (the same refusal path, reached by config).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from chaos.checker import NodeState
from chaos.history import DELETES, IDENTITY, MEMBERS, MESSAGES
from cluster.local import Cluster
from sim.engine import view_digest_of
from store.chatdb import ChatDb
from store.rocks import ChatDbConfig
from sync.replica import DbReplica

BALLAST = "chaos.ballast"
ADMIN_TIMEOUT_S = 2.0


class ChaosNodes:
    def __init__(
        self,
        nodes: int,
        base: Path,
        *,
        durable: bool = True,
        plant: str = "",
        plant_nodes: list[int] | None = None,
        disk_mb: int = 256,
        min_free_mb: int = 32,
        sync_interval_s: float = 2.0,
    ) -> None:
        config: dict[str, Any] = {"min_free_disk_mb": min_free_mb, "verify_processes": 0}
        self.cluster = Cluster(
            nodes, base, durable=durable, sync_interval_s=sync_interval_s, node_config=config
        )
        self.min_free_mb, self.disk_mb = min_free_mb, disk_mb
        if plant:
            for i in range(nodes) if plant_nodes is None else plant_nodes:
                self.cluster.node_overrides[i] = {"chaos_plant": plant}
        self.mounted: list[Path] = []
        self.paused: set[int] = set()
        self.admin = httpx.Client(timeout=ADMIN_TIMEOUT_S)

    @property
    def count(self) -> int:
        return len(self.cluster.nodes)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.cluster.nodes]

    def start(self) -> None:
        self._mount_disks()
        self.cluster.start()

    def _mount_disks(self) -> None:
        for node in self.cluster.nodes:
            node.data.mkdir(parents=True, exist_ok=True)
            size = f"size={self.disk_mb}m"
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(node.data)],
                capture_output=True,
                check=False,
            )
            if done.returncode != 0:
                self._unmount()
                return
            self.mounted.append(node.data)

    @property
    def tmpfs(self) -> bool:
        return len(self.mounted) == self.count

    def _unmount(self) -> None:
        for path in self.mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self.mounted.clear()

    # --- faults ---

    def alive(self, i: int) -> bool:
        return self.cluster.nodes[i].alive

    def kill(self, i: int) -> None:
        self.paused.discard(i)
        self.cluster.stop(i, kill=True)

    def restart(self, i: int) -> None:
        """Stop (SIGTERM) if running, then start with the node's current config."""
        if self.alive(i):
            self.resume(i)
            self.cluster.stop(i)
        self.cluster.restart(i)

    def pause(self, i: int) -> None:
        proc = self.cluster.nodes[i].proc
        if proc is not None and self.alive(i):
            os.kill(proc.pid, signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        proc = self.cluster.nodes[i].proc
        if i in self.paused and proc is not None and self.alive(i):
            os.kill(proc.pid, signal.SIGCONT)
        self.paused.discard(i)

    def set_config(self, i: int, key: str, value: Any) -> None:
        """A [node] setting for node ``i``'s next start (None: back to the default)."""
        values = self.cluster.node_overrides.setdefault(i, {})
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value

    def switch(self, at: int, peer: int, block: bool) -> bool:
        """Node ``at`` drops (or takes again) ``peer``'s traffic; False if it did not answer."""
        node, other = self.cluster.nodes[at], self.cluster.nodes[peer]
        if not node.alive or at in self.paused:
            return False
        try:
            self.admin.post(
                f"{node.url}/admin/{'block' if block else 'unblock'}",
                json={"peer_id": other.peer_id},
                headers=node.admin_headers(),
            ).raise_for_status()
        except (httpx.HTTPError, OSError):
            return False
        return True

    def fill_disk(self, i: int) -> str:
        data = self.cluster.nodes[i].data
        if not self.tmpfs:  # the same refusal, reached by config: a restart
            free_mb = shutil.disk_usage(data).free // 2**20
            self.set_config(i, "min_free_disk_mb", free_mb + 1024)
            self.restart(i)
            return f"min_free_disk_mb {free_mb + 1024} (no tmpfs)"
        free = shutil.disk_usage(data).free
        size = max(0, free - self.min_free_mb * 2**20 // 2)
        with open(data / BALLAST, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size)
        return f"ballast {size // 2**20} MB, {shutil.disk_usage(data).free // 2**20} MB free"

    def free_disk(self, i: int) -> str:
        if not self.tmpfs:
            self.set_config(i, "min_free_disk_mb", None)
            self.restart(i)
            return "min_free_disk_mb back"
        (self.cluster.nodes[i].data / BALLAST).unlink(missing_ok=True)
        return "ballast removed"

    # --- reading ---

    def status(self, i: int, timeout_s: float = 1.0) -> dict[str, Any] | None:
        if not self.alive(i) or i in self.paused:
            return None
        try:
            data: dict[str, Any] = self.admin.get(
                f"{self.cluster.nodes[i].url}/status", timeout=timeout_s
            ).json()
        except (httpx.HTTPError, ValueError):
            return None
        return data

    def roots(self, i: int) -> dict[str, str] | None:
        status = self.status(i, timeout_s=5.0)
        if status is None:
            return None
        return {name: f"{d['root']}:{d['count']}" for name, d in status["domains"].items()}

    def final_state(
        self, i: int, chats: list[str], users: list[str], roots: dict[str, str] | None
    ) -> NodeState:
        """Node ``i``'s records, identities, visible messages and views, read from its
        RocksDB directory (the node must be stopped)."""
        data = self.cluster.nodes[i].data
        (data / BALLAST).unlink(missing_ok=True)
        db = ChatDb(ChatDbConfig(path=str(data), block_cache_mb=8, memtable_mb=8))
        try:
            replica = DbReplica(db)
            ids = {
                MESSAGES: {m.hex() for m, _ in db.iter_msg_ids()},
                DELETES: {d.hex() for d in db.iter_delete_ids()},
                MEMBERS: {m.hex() for m in db.iter_member_record_ids()},
                IDENTITY: {r.hex() for r in db.iter_identity_record_ids()},
            }
            identities = {}
            for user in users:
                held = db.get_identity(bytes.fromhex(user))
                if held is not None:
                    identities[user] = held[0].pack()
            visible: set[str] = set()
            views = {}
            for chat in chats:
                chat_id = bytes.fromhex(chat)
                visible |= {v.hex() for v in replica.visible_ids(chat_id)}
                views[chat] = view_digest_of(replica.view(chat_id)).hex()
        finally:
            db.close()
        return NodeState(i, ids, identities, visible, views, roots)

    def stop_all(self) -> None:
        for i in range(self.count):
            self.resume(i)
        self.cluster.close()

    def close(self) -> None:
        try:
            self.stop_all()
        finally:
            self.admin.close()
            self._unmount()
