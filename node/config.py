"""Node configuration: defaults, a TOML file, then command-line flags — later wins."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from node.errors import InvalidAddress, StartupRefused
from node.plants import check_plant
from store.hlc import DEFAULT_MAX_OFFSET_MS
from store.records import DEFAULT_MAX_PAYLOAD
from store.rocks import check_compression
from sync.protocol import SyncConfig
from sync.scope import DEFAULT_REPLICATION, DEFAULT_SHARDS, Scope, ScopeError


@dataclass(frozen=True)
class NodeConfig:
    data: str = "./chatdb-data"
    listen: str = "/ip4/127.0.0.1/tcp/0"
    http: str = "127.0.0.1:8080"
    bootstrap: tuple[str, ...] = ()
    key: str | None = None  # libp2p identity file; default: <data>/node.key
    durable: bool = False  # acknowledge a write only once its WriteBatch is synced to the WAL
    # write pipeline
    write_queue: int = 16384  # ops waiting to be written before submitters wait
    write_batch_max: int = 2048  # ops applied in one WriteBatch
    # RocksDB's block cache and memtables: a node holding 1,000,000 messages keeps its RSS
    # under 300 MB with these (the store's own defaults, seed 002's, are 512 and 512)
    db_block_cache_mb: int = 32
    db_memtable_mb: int = 64
    # "lz4", "zstd" (seed 002's) or "none": LZ4 halves the CPU RocksDB's compactions take
    # (8 us per message of a catch-up) for files 6 % larger (store/rocks.py, COMPRESSION)
    db_compression: str = "lz4"
    # gossip
    gossip_batch_ops: int = 1024  # ops per gossip message, at most
    gossip_batch_delay_ms: int = 20  # how long the publisher waits to fill a batch
    # the least time between two of this node's messages: py-libp2p's CPU cost is per
    # message, ~10 ms on each of 5 peers, so the message rate is what saturates a cluster
    gossip_min_interval_ms: int = 200
    # ... and more as more nodes publish: their messages together about this many a second
    # (each node's share, P / rate, capped at gossip_max_interval_ms: node/gossip/batching.py)
    gossip_network_messages_per_s: float = 25.0
    gossip_max_interval_ms: int = 600
    gossip_max_bytes: int = 900 * 1024  # py-libp2p drops RPCs over 1 MiB
    gossip_heartbeat_s: int = 1
    # the mesh's D (node/p2p/host.py:mesh_bounds): each message is received about D times
    gossip_degree: int = 4
    # anti-entropy
    sync_interval_s: float = 10.0  # per peer, with +-25 % jitter
    # a session whose peer sends nothing for this long ends (``timeout``, penalized), longer
    # by the time the frame in flight takes at sync_min_bytes_per_s; also the limit for
    # opening a sync stream. The one idle timeout: sync.protocol's SyncConfig.idle_timeout_ms
    sync_idle_timeout_s: float = SyncConfig.idle_timeout_ms / 1000
    sync_min_bytes_per_s: int = SyncConfig.min_bytes_per_s  # slower than this is silence
    # sessions at once per direction (we answer / we open), one per peer (SECURITY.md)
    sync_max_sessions: int = 4
    sync_max_frame: int = 4 * 1024 * 1024
    # messages younger than this are left to gossip (SyncConfig.settle_ms): at 2,000 ops/s a
    # session moved a fifth of them twice, racing gossip. Gossip's max latency there: ~1 s
    sync_settle_s: float = 3.0
    # processes checking a big sync frame's signatures (catch-up speed; node/verify.py); 0: the
    # calling thread does
    verify_processes: int = 2
    # peers (node/peers.py): connections kept between the low and the high water whatever the
    # network's size; anti-entropy with this many of them per sync interval; peer exchange
    peers_low: int = 6  # GossipSub's D: its mesh needs this many
    peers_high: int = 10
    sync_peers_per_interval: int = 2
    peer_exchange_interval_s: float = 30.0
    reconnect_min_s: float = 0.5  # dial backoff, per known peer
    reconnect_max_s: float = 30.0
    # connections (SECURITY.md, "Limits"): inbound ones are strangers' until they prove useful
    # inbound connections at once (py-libp2p's own cap: 250). Each costs ~60 KB of Python
    # objects while it lasts, and a flood leaves that much as Python's allocator high-water
    # (docs/BENCHMARKS.md, "hostile peers"): 64 held, +4-5 MB after; 200 held, +13 MB.
    inbound_max: int = 64
    inbound_per_ip: int = 16  # inbound connections at once from one IP address
    max_failed_dials: int = 3  # py-libp2p's auto-connector forgets a peer after this many
    notice_interval_s: float = 600.0  # one log line per peer (or IP) and reason this often
    # input limits
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_offset_ms: int = DEFAULT_MAX_OFFSET_MS
    # limits (SECURITY.md)
    author_ops_per_s: float = 1_000.0  # ops per author, API and gossip
    author_ops_burst: float = 10_000.0
    # per forwarding peer: gossip messages we refuse (replays of ops we hold included), and
    # their bytes; 10 s of each as a burst, then the peer is throttled (SECURITY.md)
    gossip_peer_waste_per_s: float = 20.0
    gossip_peer_waste_bytes_per_s: float = 2 * 1024 * 1024
    peer_sync_frames_per_s: float = 500.0  # per peer, all its sessions together
    peer_sync_bytes_per_s: float = 64 * 1024 * 1024
    min_free_disk_mb: int = 256  # writes refused below this
    penalty_threshold: float = 10.0  # misbehaviour points before a ban
    ban_s: float = 600.0
    # partial replication (SYNC.md, "Scopes"): the network's number of shards (the same on
    # every node), and the shards this node holds: None (``--full``), every one
    network_shards: int = DEFAULT_SHARDS
    scope_shards: tuple[int, ...] | None = None
    # ``--scope auto``: hold the chats of the users naming this node as a home node, plus
    # ``scope_shards`` (pins), plus the shards the replication-factor rule gives it among the
    # peers it knows alive (connected, or within 10 min: node/peers.py) (``replication_factor``; 0: none); a shard no longer needed
    # leaves the store ``scope_grace_s`` after (sync/serving.py)
    scope_auto: bool = False
    replication_factor: int = DEFAULT_REPLICATION
    scope_grace_s: float = 24 * 3600.0
    scope_check_interval_s: float = 1.0
    # a peer's claimed scope bounded by what it is entitled to: shards whose members name it
    # as a home node, or its shards by the R rule (sync/entitled.py; off: served what it
    # claims, as before). A network setting: a full node with it on serves a full peer only
    # the peer's entitled shards
    scope_authenticate: bool = False
    # messages and deletes gossiped on their shard's topic, subscribed by scope (a network
    # setting: the same on every node); off: one topic for everything, as before scopes
    gossip_sharded: bool = False
    # retention (RETENTION.md)
    retention_days: float = 0.0  # 0 = keep forever
    max_storage_mb: int = 0  # 0 = unlimited
    gc_interval_s: float = 300.0
    # clients (node/auth.py, node/api/events.py)
    token_ttl_s: int = 3600  # how long a sign-in lasts
    stream_send_timeout_s: float = 10.0  # a stream client leaving a page unacked this long: closed
    stream_heartbeat_s: float = 25.0  # an idle stream gets the current token this often
    dm3_sender_per_s: float = 20.0  # dm3 envelopes a sender may submit here per second (burst 5x)
    # simulator (SIM.md): record the ops clients submit here as a replayable trace
    trace_out: str | None = None
    # added to every wall-clock reading of the node (node/clock.py): the drift checks, sync
    # settling, tokens. 0 on a real node; ``chatsync chaos`` skews a node's clock with it
    clock_offset_ms: int = 0
    # ``chatsync chaos`` only: a bug to plant ("", "ack-before-wal", "drop-one-in-N";
    # node/plants.py). Never set on a real node
    chaos_plant: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key_path(self) -> Path:
        return Path(self.key) if self.key else Path(self.data) / "node.key"

    @property
    def http_host_port(self) -> tuple[str, int]:
        return parse_http(self.http)

    @property
    def scope(self) -> Scope:
        """What the node holds (``sync.scope``); ``ScopeError`` if it cannot be."""
        if self.scope_auto:  # the pins: served users' shards are added while running
            return Scope(frozenset(self.scope_shards or ()), self.network_shards)
        shards = None if self.scope_shards is None else frozenset(self.scope_shards)
        return Scope(shards, self.network_shards)


# Keys a config file may still hold under an older name: refused, with the new name.
RENAMED = {
    "sync_read_timeout_s": "sync_idle_timeout_s",
    "verify_threads": "verify_processes",
}


def load_config(path: str | None, overrides: dict[str, Any]) -> NodeConfig:
    """Defaults < TOML file < ``overrides`` (flags given on the command line; None = not given).

    Anything wrong is ``StartupRefused``, one line naming the key (or flag) and its value."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                values.update(tomllib.load(f).get("node", {}))
        except OSError as exc:
            raise StartupRefused(f"config {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise StartupRefused(f"config {path}: {exc}") from exc
    in_file = set(values)
    flags = {k for k, v in overrides.items() if v is not None}
    values.update({k: overrides[k] for k in flags})
    known = {f.name for f in fields(NodeConfig)}
    renamed = sorted(k for k in values if k in RENAMED)
    if renamed:
        raise StartupRefused(", ".join(f"config key {k} is now {RENAMED[k]}" for k in renamed))
    unknown = sorted(set(values) - known)
    if unknown:
        raise StartupRefused(f"unknown config keys: {', '.join(unknown)}")
    if "bootstrap" in values:
        values["bootstrap"] = tuple(values["bootstrap"])
    if values.get("scope_shards") is not None:
        values["scope_shards"] = tuple(values["scope_shards"])
    config = replace(NodeConfig(), **values)
    try:
        if not 1 <= config.peers_low <= config.peers_high:
            raise ValueError("peers_low and peers_high: need 1 <= peers_low <= peers_high")
        if config.sync_peers_per_interval < 1:
            raise ValueError("sync_peers_per_interval: at least 1")
        check_compression(config.db_compression, "db_compression")
        check_plant(config.chaos_plant)
        _ = config.scope
        if config.replication_factor < 0 or config.scope_grace_s < 0:
            raise ValueError("replication_factor and scope_grace_s: not negative")
    except ScopeError as exc:
        raise StartupRefused(f"scope_shards and network_shards: {exc}") from exc
    except ValueError as exc:
        raise StartupRefused(str(exc)) from exc

    def named(key: str) -> str:
        return f"--{key}" if key in flags else f"{key} in {path}" if key in in_file else key

    check_addresses(config, named)
    return config


WILDCARDS = {"0.0.0.0", "::"}  # a listener there takes the port on every address


def check_addresses(config: NodeConfig, named: Callable[[str], str]) -> None:
    """``listen``, ``bootstrap`` and ``http`` parse, and the two ports differ (py-libp2p
    would take the port first, then the HTTP server fail). ``named(key)`` says where a value
    came from, for the message."""
    from node.p2p.addresses import parse_listen, parse_peer_address  # multiaddr: only here

    def refused(key: str, value: str, exc: ValueError) -> StartupRefused:
        return StartupRefused(f"{named(key)} {value!r}: {exc}")

    try:
        listen = parse_listen(config.listen)
    except InvalidAddress as exc:
        raise refused("listen", config.listen, exc) from exc
    for address in config.bootstrap:
        try:
            parse_peer_address(address)
        except InvalidAddress as exc:
            raise refused("bootstrap", address, exc) from exc
    if not config.http:
        return  # no HTTP API
    try:
        host, port = parse_http(config.http)
    except ValueError as exc:
        raise refused("http", config.http, exc) from exc
    if listen.port == port and (host == listen.host or {host, listen.host} & WILDCARDS):
        raise StartupRefused(
            f"{named('listen')} {config.listen!r} and {named('http')} {config.http!r} "
            f"use the same port"
        )


def parse_http(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an empty host: 127.0.0.1) -> (host, port); ``ValueError`` saying why not."""
    host, colon, port = text.rpartition(":")
    if not colon:
        raise ValueError("no port (HOST:PORT)")
    if not port.isdigit() or not port.isascii():
        raise ValueError(f"port {port!r} is not a number")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {int(port)} is out of range (1-65535)")
    return host or "127.0.0.1", int(port)


AUTO = "auto"


def parse_scope(text: str) -> tuple[int, ...]:
    """``--scope 0,5,17`` -> (0, 5, 17) (``auto`` among them is the caller's: dropped);
    ``StartupRefused`` saying why not."""
    parts = [p.strip() for p in text.split(",") if p.strip() and p.strip() != AUTO]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise StartupRefused(f"--scope {text!r}: shard numbers separated by commas, e.g. 0,5,17")
    return tuple(sorted({int(p) for p in parts}))
