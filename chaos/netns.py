"""Network namespaces for the partition drills (``--net netns``; needs root and iproute2).

Each node (a ``cronoq-server`` replica, the drill's Postgres) runs in a namespace of its own,
joined by a veth pair to a bridge in the drill's namespace (where the launcher, its proxies, the
producers, workers and monitor run). The bridge holds the drill's addresses in a private /24 of
``10.213.0.0/16`` picked per run, plus one address per shard endpoint, so that a node can be cut
from one shard's endpoint and not from another's.

A partition is routes only: ``ip route add unreachable ADDRESS/32`` in the namespace of each
node on one side, for every address of the other side (and the reverse), deleted to heal. With
such a route, connections already open go silent (TCP keeps retransmitting into nothing) and new
ones fail at once with "No route to host". The drill's own namespace is never cut: clients keep
reaching both sides, as in a partition between nodes of a data centre.

Names carry the pid of the process that made them (``cq<pid>-<n>``): namespaces and links left by
a process that died are swept before a new network is made.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import random
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cronoq.cluster.layout import Placement
from cronoq.cluster.probe import pid_alive

__all__ = [
    "POSTGRES_NODE",
    "NetnsError",
    "Network",
    "Partition",
    "available",
    "cluster_network",
    "placements",
    "sweep_stale",
]

SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
HUB_HOST = 1
"""The bridge's own address in the run's /24 (``.1``): what the proxies' connections come from."""
FIRST_NODE_HOST = 10
FIRST_HUB_EXTRA = 200
LOCK_PATH = Path("/tmp/cronoq-netns.lock")
"""Held while a network picks its /24 and creates its links, so two runs never pick the same."""
_NAME = re.compile(r"^cq(\d+)-(\d+)")
_sequence = 0


class NetnsError(RuntimeError):
    """iproute2 refused a step; the message has its command and its error."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


_AVAILABLE: bool | None = None


def available() -> bool:
    """Whether this process may make namespaces (root, iproute2): one is made and removed to know."""
    global _AVAILABLE
    if _AVAILABLE is None:
        probe = f"cq{os.getpid()}-probe"
        try:
            _ip("netns", "add", probe)
            _ip("netns", "del", probe)
            _AVAILABLE = True
        except (NetnsError, OSError, subprocess.SubprocessError):
            _AVAILABLE = False
    return _AVAILABLE


def _stale(name: str) -> bool:
    found = _NAME.match(name)
    return found is not None and not pid_alive(int(found.group(1)))


def sweep_stale() -> list[str]:
    """Delete the namespaces and links of drills whose process is gone; their names."""
    removed = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split(" ", 1)[0]
        if name and _stale(name):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@", 1)[0]
        if _stale(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _used_subnets() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    used: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for line in _ip("-4", "-o", "addr", "show", check=False).splitlines():
        for word in line.split():
            if "/" in word and word[0].isdigit():
                with contextlib.suppress(ValueError):
                    used.add(ipaddress.ip_interface(word).network)
    return used


@dataclass(eq=False)
class Partition:
    """Routes that cut one set of addresses from another; ``heal()`` deletes them."""

    network: Network
    routes: list[tuple[str, str]] = field(default_factory=list)
    """(namespace, address) of every unreachable route added."""

    def heal(self) -> None:
        for namespace, address in self.routes:
            _ip("-n", namespace, "route", "del", "unreachable", f"{address}/32", check=False)
        self.routes.clear()


class Network:
    """The nodes' namespaces, the bridge and the addresses of one run. ``create()`` first;
    ``destroy()`` always (it is safe after a failed ``create``)."""

    def __init__(self, nodes: Sequence[str], hub_names: Sequence[str] = ()) -> None:
        global _sequence
        _sequence = (_sequence + 1) % 100
        self.tag = f"cq{os.getpid()}-{_sequence}"
        self.nodes = list(nodes)
        self.hub_names = list(hub_names)
        """Names of extra addresses on the bridge (shard endpoints), in the drill's namespace."""
        self.subnet: ipaddress.IPv4Network | None = None
        self.addresses: dict[str, str] = {}
        self._namespaces: dict[str, str] = {}
        self._partitions: list[Partition] = []

    @property
    def bridge(self) -> str:
        return f"{self.tag}b"

    @property
    def hub_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet[HUB_HOST])

    def namespace(self, node: str) -> str:
        return self._namespaces[node]

    def address(self, name: str) -> str:
        """The address of a node or of a hub name."""
        return self.addresses[name]

    def prefix(self, node: str) -> tuple[str, ...]:
        """The command prefix that runs a program in ``node``'s namespace."""
        return ("ip", "netns", "exec", self.namespace(node))

    def create(self) -> None:
        if len(self.nodes) > FIRST_HUB_EXTRA - FIRST_NODE_HOST or len(self.hub_names) > 50:
            raise NetnsError("too many nodes for one /24")
        sweep_stale()
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                used = _used_subnets()
                free = [s for s in SUBNETS.subnets(new_prefix=24) if not any(s.overlaps(u) for u in used)]
                if not free:
                    raise NetnsError(f"no free /24 left in {SUBNETS}")
                subnet = self.subnet = random.choice(free)
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.hub_address}/24", "dev", self.bridge)
                for index, name in enumerate(self.hub_names):
                    address = str(subnet[FIRST_HUB_EXTRA + index])
                    _ip("addr", "add", f"{address}/32", "dev", self.bridge)
                    self.addresses[name] = address
                _ip("link", "set", self.bridge, "up")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        for index, node in enumerate(self.nodes):
            self._add_node(index, node)

    def _add_node(self, index: int, node: str) -> None:
        assert self.subnet is not None
        namespace = f"{self.tag}-{re.sub(r'[^A-Za-z0-9_-]', '_', node)}"
        outside = f"{self.tag}v{index}"
        address = str(self.subnet[FIRST_NODE_HOST + index])
        _ip("netns", "add", namespace)
        self._namespaces[node] = namespace
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        self.addresses[node] = address

    def cut(self, side_a: Iterable[str], side_b: Iterable[str]) -> Partition:
        """No traffic between the names of ``side_a`` and those of ``side_b`` (nodes or hub names;
        routes go into the nodes' namespaces, so a hub name is cut only from the nodes)."""
        partition = Partition(self)
        first, second = list(side_a), list(side_b)
        try:
            for sources, targets in ((first, second), (second, first)):
                for source in sources:
                    if source not in self._namespaces:
                        continue
                    for target in targets:
                        address = self.addresses[target]
                        _ip("-n", self._namespaces[source], "route", "add", "unreachable", f"{address}/32")
                        partition.routes.append((self._namespaces[source], address))
        except BaseException:
            partition.heal()
            raise
        self._partitions.append(partition)
        return partition

    def destroy(self) -> None:
        for partition in self._partitions:
            partition.heal()
        for index, namespace in enumerate(self._namespaces.values()):
            # The pair goes with either end; its outside end first, in case a process still
            # holds the namespace open.
            _ip("link", "del", f"{self.tag}v{index}", check=False)
            _ip("netns", "del", namespace, check=False)
        self._namespaces.clear()
        if self.subnet is not None:
            _ip("link", "del", self.bridge, check=False)


POSTGRES_NODE = "postgres"


def cluster_network(shards: Sequence[str], replicas: Sequence[str], *, postgres: bool) -> Network:
    """A network (not created yet) for a cluster: a node per replica (and for the drill's
    Postgres), and a hub address per shard for its endpoint."""
    return Network([*replicas, *([POSTGRES_NODE] if postgres else [])], shards)


def placements(network: Network, shards: Sequence[str], replicas: Sequence[str]) -> dict[str, Placement]:
    """Where the launcher puts each replica and each shard's endpoint in ``network``."""
    found = {name: Placement(network.address(name), network.prefix(name)) for name in replicas}
    found.update({name: Placement(network.address(name)) for name in shards})
    return found
