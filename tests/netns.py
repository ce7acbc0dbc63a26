"""Hosts apart on one machine: one network namespace per "host", joined by veth links to a bridge.

    root namespace (the test)             pdb<tag> bridge, 10.213.N.1/24
      |-- veth pd<tag><i> (the host's cable) --- eth0 of namespace pdserve-hosts-<pid>-<tag>-<host>,
                                                 10.213.N.(i+2)/24, loopback up

The test process, on the bridge, reaches every host (its probes and its own clients do); the hosts
reach each other through the bridge only. `cut(host)` takes the host's cable down at the bridge
end: its packets are dropped silently (no RST, no FIN; a new connection to it fails with "No route
to host" once ARP gets no answer), as when a cable is pulled or a switch port dies; the host keeps
its address and its sockets. `restore(host)` plugs it back in. `lose(host, percent)` drops that
share of the frames crossing the host's cable between hosts (an nftables bridge rule; needs `nft`,
`lossless_reason()` says why not), `limit_rate(host, mbit)` slows what it sends (tc tbf), `delay(host,
ms)` delays it (tc netem: needs the kernel's sch_netem). `heal()` undoes all of it.

Every name carries this run's pid and a random tag, so parallel runs never collide; `sweep_leftovers`
deletes the namespaces, bridges and nftables tables of runs whose process is gone (a crashed run).
`Topology.close()` deletes everything this run made, whatever state it is in; `topology()` is the
context manager tests use. `unavailable_reason()` says why namespaces cannot be made here, or "".
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Iterator, Sequence

PREFIX = "pdserve-hosts"
NAME = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{4}})-")
NFT_TABLE = "pdserve_hosts_"   # + tag: one bridge-family table per run, for `lose`
SUBNETS = ipaddress.ip_network("10.213.0.0/16")


class NetnsError(RuntimeError):
    """An `ip`/`nft` command failed; the message has its stderr."""


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


@dataclass(frozen=True)
class NetHost:
    name: str            # "router", "prefill", ...
    namespace: str
    address: str
    cable: str           # the veth end in the root namespace, a port of the bridge

    @property
    def command_prefix(self) -> tuple[str, ...]:
        """Runs a command on this host (the launcher's per-process prefix)."""
        return ("ip", "netns", "exec", self.namespace)


@dataclass
class Topology:
    tag: str
    bridge: str
    gateway: str                                    # the bridge's address: the test's own, on the link
    hosts: dict[str, NetHost] = field(default_factory=dict)
    _lossy: bool = False

    def __getitem__(self, name: str) -> NetHost:
        return self.hosts[name]

    def cut(self, name: str) -> None:
        run(["ip", "link", "set", self.hosts[name].cable, "down"])

    def restore(self, name: str) -> None:
        run(["ip", "link", "set", self.hosts[name].cable, "up"])

    def lose(self, name: str, percent: int) -> None:
        """Drops `percent`% of the frames to and from host `name`, drawn at random per frame (an
        nftables rule on the bridge); 0 removes the loss. NetnsError if nftables is unusable."""
        table, cable = f"{NFT_TABLE}{self.tag}", self.hosts[name].cable
        if not self._lossy:
            script = (f"add table bridge {table}\n"
                      f"add chain bridge {table} forward {{ type filter hook forward priority 0; }}\n")
            _nft(script)
            self._lossy = True
        _nft(f"flush chain bridge {table} forward\n")
        if percent:
            draw = "" if percent >= 100 else f"numgen random mod 100 < {percent} "
            _nft("".join(f"add rule bridge {table} forward {direction} \"{cable}\" {draw}drop\n"
                         for direction in ("iifname", "oifname")))

    def limit_rate(self, name: str, mbit: float) -> None:
        """Host `name` sends at most `mbit` Mbit/s (a token bucket on its side of the cable; what
        exceeds 200 ms of queue is dropped, as a slow link does); 0 lifts the limit."""
        inner = [*self.hosts[name].command_prefix, "tc", "qdisc"]
        run([*inner, "del", "dev", "eth0", "root"], check=False)
        if mbit:
            run([*inner, "add", "dev", "eth0", "root", "tbf", "rate", f"{mbit}mbit", "burst", "16kb", "latency", "200ms"])

    def delay(self, name: str, ms: float) -> None:
        """Host `name`'s packets leave `ms` late (`tc netem`); 0 removes it. NetnsError (with tc's
        "Specified qdisc kind is unknown") where the kernel has no sch_netem."""
        inner = [*self.hosts[name].command_prefix, "tc", "qdisc"]
        run([*inner, "del", "dev", "eth0", "root"], check=False)
        if ms:
            run([*inner, "add", "dev", "eth0", "root", "netem", "delay", f"{ms}ms"])

    def sent_bytes(self, name: str) -> int:
        """Bytes host `name` has sent over its cable so far (what the bridge end received)."""
        with open(f"/sys/class/net/{self.hosts[name].cable}/statistics/rx_bytes") as counter:
            return int(counter.read())

    def heal(self) -> None:
        """Every cable plugged in, lossless, at full speed and without delay."""
        for name, host in self.hosts.items():
            self.restore(name)
            run([*host.command_prefix, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        if self._lossy:
            _nft(f"flush chain bridge {NFT_TABLE}{self.tag} forward\n")

    def close(self) -> None:
        """Deletes this run's namespaces (their veth ends go with them, and so the cables), bridge and
        nftables table; never raises."""
        for host in self.hosts.values():
            run(["ip", "netns", "del", host.namespace], check=False)
            run(["ip", "link", "del", host.cable], check=False)
        run(["ip", "link", "del", self.bridge], check=False)
        if self._lossy:
            with contextlib.suppress(NetnsError, OSError):
                _nft(f"delete table bridge {NFT_TABLE}{self.tag}\n")


def _nft(script: str) -> None:
    done = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsError(f"nft: {done.stderr.strip()}")


def unavailable_reason() -> str:
    """Why hosts cannot be made here ("" when they can): not root, no iproute2, or the kernel refuses."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2 (`ip`)"
    probe = f"{PREFIX}-{os.getpid()}-0000-probe"
    done = run(["ip", "netns", "add", probe], check=False)
    run(["ip", "netns", "del", probe], check=False)
    return "" if done.returncode == 0 else f"`ip netns add` is not permitted here: {done.stderr.strip()}"


def lossless_reason() -> str:
    """Why `Topology.lose` cannot work here ("" when it can)."""
    if shutil.which("nft") is None:
        return "packet loss needs nftables (`nft`; apt-get install nftables): iptables/nft are not installed"
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30)
    return "" if done.returncode == 0 else f"nft cannot list tables here: {done.stderr.strip()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> list[str]:
    """Deletes what crashed runs (their pid gone) left behind; returns the namespaces deleted."""
    listed = run(["ip", "netns", "list"], check=False).stdout.split()
    swept, dead_tags = [], set()
    for name in listed:
        match = NAME.match(name)
        if match and not _alive(int(match.group(1))):
            run(["ip", "netns", "del", name], check=False)
            swept.append(name)
            dead_tags.add(match.group(2))
    for tag in dead_tags:
        run(["ip", "link", "del", f"pdb{tag}"], check=False)
        if shutil.which("nft"):
            subprocess.run(["nft", "delete", "table", "bridge", f"{NFT_TABLE}{tag}"], capture_output=True, timeout=30)
    return swept


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no interface of the root namespace is on."""
    used = {ipaddress.ip_interface(word).network
            for word in run(["ip", "-4", "-o", "addr", "show"]).stdout.split() if re.match(r"^\d+\.\d+\.\d+\.\d+/\d+$", word)}
    candidates = list(SUBNETS.subnets(new_prefix=24))
    start = secrets.randbelow(len(candidates))
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NetnsError(f"no free /24 in {SUBNETS}")


def build(names: Sequence[str]) -> Topology:
    """A bridge and one namespace per name, each with its address on a free /24 (the bridge has .1).
    On failure everything made so far is deleted and NetnsError raised."""
    sweep_leftovers()
    tag = secrets.token_hex(2)
    subnet = _free_subnet()
    addresses = list(subnet.hosts())
    topo = Topology(tag=tag, bridge=f"pdb{tag}", gateway=str(addresses[0]))
    try:
        run(["ip", "link", "add", topo.bridge, "type", "bridge", "forward_delay", "0"])
        run(["ip", "addr", "add", f"{topo.gateway}/24", "dev", topo.bridge])
        run(["ip", "link", "set", topo.bridge, "up"])
        for index, name in enumerate(names):
            host = NetHost(name, f"{PREFIX}-{os.getpid()}-{tag}-{name}", str(addresses[index + 1]), f"pd{tag}{index}")
            topo.hosts[name] = host
            inner = f"pd{tag}{index}n"
            run(["ip", "netns", "add", host.namespace])
            run(["ip", "link", "add", host.cable, "type", "veth", "peer", "name", inner])
            run(["ip", "link", "set", inner, "netns", host.namespace])
            run(["ip", "link", "set", host.cable, "master", topo.bridge])
            run(["ip", "link", "set", host.cable, "up"])
            for command in (["ip", "link", "set", inner, "name", "eth0"], ["ip", "addr", "add", f"{host.address}/24",
                            "dev", "eth0"], ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
                run([*host.command_prefix, *command])
    except BaseException:
        topo.close()
        raise
    return topo


@contextlib.contextmanager
def topology(names: Sequence[str]) -> Iterator[Topology]:
    """`build(names)`, closed on the way out whatever happened."""
    topo = build(names)
    try:
        yield topo
    finally:
        topo.close()
