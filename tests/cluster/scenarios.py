#!/usr/bin/env python3
"""Real-process cluster scenarios (docs/design/cluster.md §11.2), on one machine.

Starts a three-member etcd cluster and four `stria node run` processes on 127.0.0.1 (distinct
ports, file-backed slices in a temporary directory; the fourth node has no etcd member and
starts with no volume on it), specifies a mirror:3 volume and an ec:2+1 volume, and runs the
register workload of tests/cluster/registers.py against each, with every node's NBD address,
while a fault is applied to the node that owns the volume:

  kill9  kill -9 of the owner's node, then the node is started again (same directory and ports)
         before the out-time: its member is rebuilt in place
  outtime  kill -9 of the owner's node, started again only once its member was rebuilt on
         another node's free slice, past the out-time (`--out-time`, 8 s here)
  stop   kill -STOP of the owner's node for longer than the lease TTL, then kill -CONT: a
         successor takes the volume, and the paused node must complete no write after it resumes
  etcd   two of the three etcd members paused for three TTLs, then resumed: the owner suspends
         I/O past its lease deadline and serves again by itself
  move   planned moves (`stria cluster volume-move`) to every other node and back, while the
         client talks to one node only, which forwards to the owner: no error at the client
  partition (with --netns) the owner's namespace, its etcd member included, cut off the bridge:
         the majority side takes over (or, when no other node can assemble the volume without
         the cut node's slice, the healed node takes it again at a new epoch); after the heal the
         old ownership completes no write

After the rounds, `stria cluster volume-delete e` through the CLI: refused while a client holds
e at a node, then done; e's keys and claims are gone and m is still served.

Each round ends with `registers.py check` (no acknowledged write lost, every register's history
linearizable, nothing invented), then waits until the volume has every member in service again
with none rebuilding (redundancy back, with no operator), and prints the failover time (the
longest time the client could complete no operation), the time to full redundancy, and the
bytes the nodes rebuilt (their logs' `rebuild done` lines). Every PID started is tracked and stopped (SIGTERM, then SIGKILL) even
when the test fails; the temporary directory is removed.

With --netns three nodes, each with its etcd member, run in a network namespace of their own
and the clients in a fourth, joined by a bridge in a fifth; the test makes them and deletes
them (no fourth node there, so no outtime scenario).

Usage: scenarios.py PATH/TO/stria [--rounds N] [--scenarios kill9,outtime,stop,etcd,move,partition]
                    [--netns] [--ttl SECONDS]
The test command runs one round of each; `--rounds 50` is the long mode quoted in the notes.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Seconds a node may stay away before its members are rebuilt elsewhere (the kill9 restart comes
# back well within it; the outtime scenario waits past it).
OUT_TIME = 8
REGISTERS = os.path.join(HERE, "registers.py")
# Each member's share of the volumes the test makes (32 MiB each): mirror:3 and ec:2+1.
MEMBER_BYTES = {"m": 32 << 20, "e": 16 << 20}


_TAKEN: set[int] = set()


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel hands out (a bind to
    port 0, or the local end of any outgoing connection, etcd's own included) could be taken by
    another socket between this check and the node's bind, as one run found (`Address already in
    use`); one below the range is taken only by an explicit bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _TAKEN.add(port)
        return port
    raise SystemExit(f"no free port below {low}")


class Procs:
    """Every process the test starts, stopped at the end whatever happens."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], log: str) -> subprocess.Popen:
        out = open(log, "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def signal(self, name: str, sig: int) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.kill(p.pid, sig)

    def wait_gone(self, name: str, timeout: float) -> bool:
        try:
            self.procs[name].wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop_all(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True)


class Netns:
    """Three node namespaces and a client namespace on a bridge in a namespace of its own, made
    and deleted by the test (names unique per run; addresses only inside the namespaces)."""

    def __init__(self) -> None:
        tag = os.urandom(3).hex()
        self.br = f"stria{tag}-br"
        self.nodes = [f"stria{tag}-n{i}" for i in range(3)]
        self.client = f"stria{tag}-c"
        self.ip = [f"10.213.0.{i + 1}" for i in range(3)]
        self.client_ip = "10.213.0.10"
        self.made: list[str] = []
        self.tag = tag

    def setup(self) -> None:
        sh("ip", "netns", "add", self.br)
        self.made.append(self.br)
        sh("ip", "-n", self.br, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.br, "link", "set", "br0", "up")
        for k, (ns, ip) in enumerate(zip([*self.nodes, self.client], [*self.ip, self.client_ip])):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            inner, outer = f"v{self.tag}{k}", f"p{self.tag}{k}"
            sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "netns", self.br)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.br, "link", "set", outer, "master", "br0")
            sh("ip", "-n", self.br, "link", "set", outer, "up")

    def port(self, i: int) -> str:
        return f"p{self.tag}{i}"

    def cut(self, i: int, down: bool) -> None:
        """Cuts node i's namespace off the bridge (its etcd member and its node), or heals it."""
        sh("ip", "-n", self.br, "link", "set", self.port(i), "down" if down else "up")

    def delete(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


class Cluster:
    def __init__(self, stria: str, work: str, procs: Procs, ttl: int, netns: Netns | None = None) -> None:
        self.stria, self.work, self.procs, self.ttl, self.netns = stria, work, procs, ttl, netns
        # Nodes: four on the loopback, three with namespaces (etcd members: always three).
        self.n = 4 if netns is None else 3
        if netns is None:
            self.host = ["127.0.0.1"] * self.n
            self.etcd_client = [free_port() for _ in range(3)]
            self.etcd_peer = [free_port() for _ in range(3)]
            self.slice_port = [free_port() for _ in range(self.n)]
            self.nbd_port = [free_port() for _ in range(self.n)]
        else:
            self.host = list(netns.ip)
            self.etcd_client, self.etcd_peer = [2379] * 3, [2380] * 3
            self.slice_port, self.nbd_port = [7700] * 3, [10809] * 3
        self.endpoints = ",".join(f"http://{self.host[i]}:{self.etcd_client[i]}" for i in range(3))
        # Each node's metrics, status API and page, on its own loopback.
        self.http_port = [free_port() for _ in range(self.n)]

    def node_cmd(self, i: int, argv: list[str]) -> list[str]:
        """`argv` run in node i's namespace (as it is when there are none)."""
        return argv if self.netns is None else ["ip", "netns", "exec", self.netns.nodes[i], *argv]

    def client_cmd(self, argv: list[str]) -> list[str]:
        """`argv` run where the clients are: the client namespace."""
        return argv if self.netns is None else ["ip", "netns", "exec", self.netns.client, *argv]

    def nbd_uri(self, i: int, volume: str) -> str:
        return f"nbd://{self.host[i]}:{self.nbd_port[i]}/{volume}"

    def direct_uri(self, i: int, volume: str) -> str:
        """Node i's own service of `volume` as its owner (what forwarders use; `volume` itself
        is forwarded to the owner by any node, so a write there may succeed through another)."""
        return f"nbd://{self.host[i]}:{self.nbd_port[i]}/owner/{volume}"

    def start_etcd(self) -> None:
        h = self.host
        initial = ",".join(f"e{i}=http://{h[i]}:{self.etcd_peer[i]}" for i in range(3))
        for i in range(3):
            self.procs.start(f"etcd{i}", self.node_cmd(i, [
                "etcd", "--name", f"e{i}", "--data-dir", f"{self.work}/etcd{i}",
                "--listen-client-urls", f"http://{h[i]}:{self.etcd_client[i]}",
                "--advertise-client-urls", f"http://{h[i]}:{self.etcd_client[i]}",
                "--listen-peer-urls", f"http://{h[i]}:{self.etcd_peer[i]}",
                "--initial-advertise-peer-urls", f"http://{h[i]}:{self.etcd_peer[i]}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                # A member cut off and back must not force elections on the others with its
                # higher term.
                "--pre-vote",
            ]), f"{self.work}/etcd{i}.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run(self.client_cmd(["etcdctl", "--endpoints", self.endpoints, "endpoint", "health"]),
                               capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise SystemExit("etcd did not become healthy in 30 s")

    def start_node(self, i: int, first: bool = False) -> None:
        argv = [self.stria, "node", "run", "--name", f"n{i}", "--etcd", self.endpoints,
                "--dir", f"{self.work}/n{i}", "--listen", f"{self.host[i]}:{self.slice_port[i]}",
                "--nbd", f"{self.host[i]}:{self.nbd_port[i]}", "--ttl", str(self.ttl),
                "--out-time", str(OUT_TIME), "--http", f"127.0.0.1:{self.http_port[i]}"]
        if first:
            argv += ["--slices", "2", "--slice-size", "192M"]
        self.procs.start(f"n{i}", self.node_cmd(i, argv), f"{self.work}/n{i}.log")

    def status(self) -> dict:
        r = subprocess.run(self.client_cmd([self.stria, "cluster", "status", "--etcd", self.endpoints, "--json"]),
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        return json.loads(r.stdout)

    def owner(self, volume: str) -> tuple[str, int] | None:
        """The node that owns `volume` and serves it now, with its epoch (an owner key alone may
        belong to a takeover still fencing, or one that will fail and give the volume back)."""
        for v in self.status()["volumes"]:
            if v["name"] == volume and v["owner"] and v["nbd"]:
                r = subprocess.run(self.client_cmd(["qemu-io", "-f", "raw", "-r", "-c", "read 0 4k",
                                                    f"nbd://{v['nbd']}/owner/{volume}"]),
                                   capture_output=True, text=True, timeout=10)
                if r.returncode == 0 and "read 4096/4096" in r.stdout:
                    return v["owner"], v["epoch"]
        return None

    def wait_owner(self, volume: str, timeout: float, old_epoch: int | None = None) -> tuple[str, int]:
        """Waits for a node to serve `volume` at an epoch other than `old_epoch` (a new ownership;
        it may be the same node, restarted or back from a pause or a partition)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                o = self.owner(volume)
            except (RuntimeError, subprocess.TimeoutExpired):
                o = None
            if o is not None and o[1] != old_epoch:
                return o
            time.sleep(0.2)
        raise SystemExit(f"volume {volume}: not served at a new epoch (after {old_epoch}) within {timeout} s")

    def http_get(self, i: int, path: str) -> str | None:
        """GET `path` from node i's HTTP listener (None when it does not answer)."""
        r = subprocess.run(self.node_cmd(i, ["curl", "-sf", "--max-time", "5", f"http://127.0.0.1:{self.http_port[i]}{path}"]),
                           capture_output=True, text=True, timeout=30)
        return r.stdout if r.returncode == 0 else None

    def check_http(self, volume: str) -> None:
        """Every running node's metrics say whether it owns `volume`, as etcd does; its status API
        names the owner etcd names; `promtool check metrics` passes on the owner's scrape."""
        deadline = time.monotonic() + 10
        while True:
            st = self.status()
            # The status names etcd's three members and a leader (a quorum).
            if len(st["etcd"]["members"]) != 3 or not st["etcd"]["leader"]:
                raise SystemExit(f"cluster status shows etcd as {st['etcd']}")
            owner = next(v["owner"] for v in st["volumes"] if v["name"] == volume)
            wrong = []
            scrapes = {}
            for i in range(self.n):
                if self.procs.procs[f"n{i}"].poll() is not None:
                    continue
                text = self.http_get(i, "/metrics")
                m = re.search(rf'^stria_node_volume_owned{{volume="{volume}"}} (\d+)$', text or "", re.M)
                scrapes[f"n{i}"] = text
                if m is None or (m.group(1) == "1") != (f"n{i}" == owner):
                    wrong.append(f"n{i}: {m.group(0) if m else 'no owned sample'}")
                api = self.http_get(i, "/api/v1/cluster")
                api_owner = next((v["owner"] for v in json.loads(api)["volumes"] if v["name"] == volume), "?") if api else "?"
                if api_owner != owner:
                    wrong.append(f"n{i}: /api/v1/cluster names owner {api_owner}")
            if not wrong:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"node metrics or API disagree with etcd on {volume}'s owner {owner}: {wrong}")
            time.sleep(0.5)
        if shutil.which("promtool") and scrapes.get(owner):
            r = subprocess.run(["promtool", "check", "metrics"], input=scrapes[owner], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"promtool check metrics on {owner}'s scrape: {r.stdout} {r.stderr}")

    def check_page(self) -> None:
        """Node 0's page, rendered by headless Chromium, lists every node and each volume's owner."""
        chromium = shutil.which("chromium")
        if chromium is None or self.netns is not None:
            return
        status = self.status()
        r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                            "--dump-dom", f"http://127.0.0.1:{self.http_port[0]}/"],
                           capture_output=True, text=True, timeout=120)
        cells = re.findall(r"<td>([^<]*)</td>", r.stdout)
        cordoned = {c["node"]: " (cordoned" + (": " + c["reason"] if c["reason"] else "") + ")"
                    for c in status["cordons"]}
        named = [n["name"] + cordoned.get(n["name"], "") for n in status["nodes"]]
        missing = [n for n in named if n not in cells]
        missing += [f"{v['name']} owned by {v['owner']}" for v in status["volumes"]
                    if v["name"] not in cells or (v["owner"] or "none") not in cells]
        if r.returncode != 0 or missing:
            raise SystemExit(f"the node page (headless Chromium) lacks {missing}: rc {r.returncode}, {r.stderr[-500:]}")
        print(f"node page: {len(status['nodes'])} nodes ({len(cordoned)} cordoned) and {len(status['volumes'])} "
              "volumes shown", file=sys.stderr)

    def uris(self, volume: str) -> str:
        return ",".join(self.nbd_uri(i, volume) for i in range(self.n))

    def redundant(self, volume: str) -> dict | None:
        """The volume's status when it is served with all its members in service and complete."""
        for v in self.status()["volumes"]:
            if v["name"] == volume and v["owner"] and not v["out"] and not v["rebuilding"] and len(v["in_service"]) == 3:
                return v
        return None

    def wait_redundant(self, volume: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                v = self.redundant(volume)
            except (RuntimeError, subprocess.TimeoutExpired):
                v = None
            if v is not None:
                return v
            time.sleep(0.3)
        raise SystemExit(f"volume {volume}: redundancy not back within {timeout} s ({self.status()})")

    def log_marks(self) -> list[int]:
        return [os.path.getsize(f"{self.work}/n{i}.log") for i in range(self.n)]

    def rebuilt_since(self, marks: list[int]) -> tuple[int, int]:
        """Bytes the nodes logged as rebuilt (copied) and as skipped by a delta resync since
        `marks`."""
        copied = skipped = 0
        for i, mark in enumerate(marks):
            with open(f"{self.work}/n{i}.log", "rb") as f:
                f.seek(mark)
                for line in f.read().decode(errors="replace").splitlines():
                    if "rebuild done" in line:
                        m = re.search(r"rebuilt_bytes=(\d+)", line)
                        copied += int(m.group(1)) if m else 0
                        m = re.search(r"skipped_bytes=(\d+)", line)
                        skipped += int(m.group(1)) if m else 0
        return copied, skipped


def run_round(c: Cluster, scenario: str, volume: str, rnd: int, seconds: float, logs: list[str]) -> dict:
    """One fault under the register workload; `logs` holds the volume's earlier logs (the
    registers keep their values across rounds, so every check reads all of them)."""
    owner, epoch = c.wait_owner(volume, 60)
    victim = int(owner[1:])
    log = f"{c.work}/reg-{scenario}-{volume}-{rnd}.log"
    logs.append(log)
    writer = len(logs)  # unique per volume: one writer id per run
    # The move scenario's client talks to one node that does not own the volume (forwarding),
    # and must see no error at all.
    via = (victim + 1) % c.n
    uris = c.nbd_uri(via, volume) if scenario == "move" else c.uris(volume)
    client = subprocess.Popen(c.client_cmd([sys.executable, REGISTERS, "run", "--uris", uris, "--blocks", "64",
                               "--seconds", str(seconds), "--writer", str(writer),
                               "--log", log, "--timeout", "2", "--seed", str(rnd * 100 + writer)]),
                              stdout=subprocess.PIPE, stderr=open(log + ".stderr", "w"), text=True)
    time.sleep(2)
    marks = c.log_marks()
    t_fault = time.monotonic()
    moves_ms: list[int] = []
    t_owner: float | None = None
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} {scenario} on {volume}: fault on {owner}", file=sys.stderr, flush=True)
    if scenario == "kill9":
        c.procs.signal(owner, signal.SIGKILL)
        c.procs.wait_gone(owner, 10)
        # The node comes back a little after its lease is gone, well within the out-time:
        # the new owner rebuilds its member in place.
        restart = threading.Timer(c.ttl + 4, c.start_node, args=(victim,))
        restart.start()
        try:
            new_owner, _ = c.wait_owner(volume, 90, old_epoch=epoch)
            # (Timed here: the restart below may come later than the new owner.)
            t_owner = time.monotonic() - t_fault
        finally:
            restart.join()
    elif scenario == "outtime":
        if c.n < 4:
            raise SystemExit("the outtime scenario needs the fourth node (no --netns)")
        c.procs.signal(owner, signal.SIGKILL)
        c.procs.wait_gone(owner, 10)
        new_owner, _ = c.wait_owner(volume, 90, old_epoch=epoch)
        # Past the out-time the member is rebuilt on the free node; the dead node is started
        # again only after that (its slice released, free for later rounds).
        v = c.wait_redundant(volume, OUT_TIME + 120)
        if any(s.startswith(f"{owner}/") for s in v["in_service"]):
            raise SystemExit(f"outtime on {volume}: a member stayed on the dead node {owner}: {v}")
        c.start_node(victim)
    elif scenario == "stop":
        c.procs.signal(owner, signal.SIGSTOP)
        # Resumed after its lease is surely gone: at once when a successor serves, or after
        # TTL + 6 s when none can without the paused node's slice (see kill9).
        resume = threading.Timer(c.ttl + 6, c.procs.signal, args=(owner, signal.SIGCONT))
        resume.start()
        try:
            new_owner, _ = c.wait_owner(volume, 90, old_epoch=epoch)
        finally:
            resume.cancel()
            c.procs.signal(owner, signal.SIGCONT)
        # The paused node, running again, must complete no write: not for a client that was
        # attached before the pause (the workload's connections get errors) and not for a new one.
        time.sleep(0.5)
        # (Only when another node took over: the paused node may also have taken the volume
        # again itself, at a new epoch, once it ran again.)
        w = None if new_owner == owner else subprocess.run(c.client_cmd(["qemu-io", "-f", "raw", "-c", "write -P 0x55 0 4k", c.direct_uri(victim, volume)]),
                           capture_output=True, text=True, timeout=60)
        if w is not None and w.returncode == 0 and "wrote 4096/4096" in w.stdout:
            raise SystemExit(f"stop on {volume}: the resumed old owner {owner} completed a write")
    elif scenario == "partition":
        if c.netns is None:
            raise SystemExit("the partition scenario needs --netns")
        # The owner's namespace (its etcd member and its node) is cut off the bridge: the
        # majority side takes over; healed when a successor serves, or after TTL + 6 s when none
        # can without the cut node's slice (see kill9).
        c.netns.cut(victim, True)
        heal = threading.Timer(c.ttl + 6, c.netns.cut, args=(victim, False))
        heal.start()
        try:
            new_owner, _ = c.wait_owner(volume, 90, old_epoch=epoch)
        finally:
            heal.cancel()
            c.netns.cut(victim, False)
        # Healed, the old owner serves nothing: its lease is gone.
        time.sleep(1)
        w = None if new_owner == owner else subprocess.run(c.client_cmd(["qemu-io", "-f", "raw", "-c", "write -P 0x55 0 4k", c.direct_uri(victim, volume)]),
                           capture_output=True, text=True, timeout=60)
        if w is not None and w.returncode == 0 and "wrote 4096/4096" in w.stdout:
            raise SystemExit(f"partition on {volume}: the old owner {owner} completed a write after the heal")
    elif scenario == "move":
        # Planned moves (`stria cluster volume-move`): to every other node in turn, the client's
        # own node included, then back where the volume was.
        targets = [i for i in range(c.n) if i != victim] + [victim]
        for i in targets:
            r = subprocess.run(c.client_cmd([c.stria, "cluster", "volume-move", volume, f"n{i}",
                                             "--etcd", c.endpoints, "--wait", "60"]),
                               capture_output=True, text=True, timeout=90)
            m = re.search(r"in (\d+) ms", r.stdout)
            if r.returncode != 0 or m is None:
                raise SystemExit(f"move of {volume} to n{i}: {r.stdout} {r.stderr}")
            moves_ms.append(int(m.group(1)))
            time.sleep(1)
        # A move to a node that is not alive is refused with a clear error, and nothing moves.
        r = subprocess.run(c.client_cmd([c.stria, "cluster", "volume-move", volume, "nobody", "--etcd", c.endpoints]),
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or "not alive" not in r.stderr:
            raise SystemExit(f"a move of {volume} to a node that is not alive: rc {r.returncode}, {r.stdout} {r.stderr}")
        new_owner, _ = c.wait_owner(volume, 60)
    elif scenario == "etcd":
        # The etcd majority goes away (two of three members paused) and comes back: the owner
        # suspends I/O past its lease deadline and resumes by itself, nothing restarted.
        for i in (1, 2):
            c.procs.signal(f"etcd{i}", signal.SIGSTOP)
        time.sleep(c.ttl * 3)
        for i in (1, 2):
            c.procs.signal(f"etcd{i}", signal.SIGCONT)
        new_owner, _ = c.wait_owner(volume, 60)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if t_owner is None:
        t_owner = time.monotonic() - t_fault
    # From here (a new ownership serves, the members it could not reach are out) the volume
    # must get every member back by itself; timed from the fault, while the workload runs.
    back: dict = {}

    def watch_redundant() -> None:
        try:
            back["v"] = c.wait_redundant(volume, OUT_TIME + 120)
            back["t"] = time.monotonic() - t_fault
        except SystemExit as e:
            back["error"] = str(e)

    watcher = threading.Thread(target=watch_redundant)
    watcher.start()
    out, _ = client.communicate(timeout=seconds + 180)
    summary = json.loads(out.strip().splitlines()[-1])
    c.wait_owner(volume, 60)
    check = subprocess.run(c.client_cmd([sys.executable, REGISTERS, "check", "--log", *logs, "--uris", c.uris(volume),
                                         "--blocks", "64", "--timeout", "2"]), capture_output=True, text=True, timeout=180)
    watcher.join()
    if "error" in back:
        raise SystemExit(f"{scenario} on {volume}, round {rnd}: {back['error']}")
    # The nodes log a rebuild when it ends: let a last one land.
    time.sleep(1)
    copied, skipped = c.rebuilt_since(marks)
    report = {"scenario": scenario, "volume": volume, "round": rnd, "old_owner": owner, "new_owner": new_owner,
              "new_owner_after_s": round(t_owner, 2), "longest_gap_s": summary.get("longest_gap_s"),
              "redundant_after_s": round(back["t"], 2), "rebuilt_bytes": copied, "skipped_bytes": skipped,
              "members": back["v"]["in_service"],
              "writes_ok": summary.get("writes_ok"), "writes_info": summary.get("writes_info"),
              "reads_ok": summary.get("reads_ok"), "check_rc": check.returncode}
    if moves_ms:
        report["moves_ms"] = moves_ms
    print(json.dumps(report), flush=True)
    if check.returncode != 0:
        print(check.stdout, check.stderr, file=sys.stderr)
        raise SystemExit(f"{scenario} on {volume}, round {rnd}: the check failed (logs in {c.work})")
    c.check_http(volume)
    # A planned move is not a failure: the client, on a node that forwards, sees no error.
    if scenario == "move" and (summary.get("writes_info") or summary.get("reads_fail") or summary.get("connects") != 1):
        raise SystemExit(f"move on {volume}, round {rnd}: the client saw errors: {summary} (logs in {c.work})")
    # A member back within the out-time gets a delta resync (docs/design/delta-resync.md): the
    # workload writes one 4 MiB region, so far less than a member's share may be copied.
    member = MEMBER_BYTES[volume]
    if scenario != "outtime" and copied >= member:
        raise SystemExit(f"{scenario} on {volume}, round {rnd}: {copied} bytes copied to bring the members back, "
                         f"not less than a whole member ({member}): no delta resync (logs in {c.work})")
    return report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("stria")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--scenarios", default="kill9,outtime,stop,etcd,move")
    ap.add_argument("--ttl", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=16)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--netns", action="store_true",
                    help="each node (with its etcd member) in a network namespace of its own, the clients in "
                         "a fourth, on a bridge (root); needed by the partition scenario")
    args = ap.parse_args()
    for tool in ("etcd", "etcdctl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt-get install etcd-server etcd-client; scripts/test.sh does)")
    work = tempfile.mkdtemp(prefix="stria-cluster.", dir="/var/tmp")
    os.chmod(work, 0o755)
    procs = Procs()
    failed = True
    reports = []
    netns = Netns() if args.netns else None
    try:
        if netns is not None:
            netns.setup()
        c = Cluster(os.path.realpath(args.stria), work, procs, args.ttl, netns)
        c.start_etcd()
        for i in range(c.n):
            c.start_node(i, first=True)
        time.sleep(2)
        for name, layout in (("m", "mirror:3"), ("e", "ec:2+1")):
            subprocess.run(c.client_cmd([c.stria, "cluster", "volume-create", name, "--layout", layout, "--size", "32M",
                                         "--etcd", c.endpoints]), check=True, capture_output=True)
        for volume in ("m", "e"):
            c.wait_owner(volume, 60)
        c.check_page()
        logs: dict[str, list[str]] = {"m": [], "e": []}
        for rnd in range(args.rounds):
            for scenario in args.scenarios.split(","):
                for volume in ("m", "e"):
                    reports.append(run_round(c, scenario, volume, rnd, args.seconds, logs[volume]))
                    # Let the cluster settle: every node back and serving.
                    time.sleep(1)
        for scenario in args.scenarios.split(","):
            gaps = [r["longest_gap_s"] for r in reports if r["scenario"] == scenario and r["longest_gap_s"] is not None]
            owners = [r["new_owner_after_s"] for r in reports if r["scenario"] == scenario]
            redundant = [r["redundant_after_s"] for r in reports if r["scenario"] == scenario]
            rebuilt = [r["rebuilt_bytes"] for r in reports if r["scenario"] == scenario]
            moves = [ms for r in reports if r["scenario"] == scenario for ms in r.get("moves_ms", [])]
            if moves:
                print(json.dumps({"scenario": scenario, "moves": len(moves),
                                  "move_median_ms": statistics.median(moves), "move_max_ms": max(moves)}), flush=True)
            if gaps:
                print(json.dumps({"scenario": scenario, "rounds": len(owners), "ttl_s": args.ttl,
                                  "failover_gap_median_s": round(statistics.median(gaps), 2),
                                  "failover_gap_max_s": round(max(gaps), 2),
                                  "new_owner_median_s": round(statistics.median(owners), 2),
                                  "redundant_median_s": round(statistics.median(redundant), 2),
                                  "rebuilt_bytes_median": int(statistics.median(rebuilt))}), flush=True)
        resize_check(c)
        drain_check(c)
        delete_check(c)
        failed = False
        return 0
    finally:
        procs.stop_all()
        if netns is not None:
            netns.delete()
        if failed or args.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def resize_check(c: Cluster) -> None:
    """`stria cluster volume-resize` (docs/design/cluster.md §6.5) through the real CLI: a shrink
    is refused without --allow-shrink; grown online, every node serves the new size to a client
    that connects, which writes and reads back a block in the new tail and finds the head as it
    was."""
    resize = [c.stria, "cluster", "volume-resize", "m", "--etcd", c.endpoints]
    r = subprocess.run(c.client_cmd(resize + ["--size", "16M"]), capture_output=True, text=True, timeout=90)
    if r.returncode == 0 or "--allow-shrink" not in r.stderr:
        raise SystemExit(f"resize: a shrink was not refused: rc {r.returncode} {r.stdout} {r.stderr}")
    head = "import nbd; h = nbd.NBD(); h.connect_uri({uri!r}); print(h.pread(4096, 0).hex())"
    before = subprocess.run(c.client_cmd([sys.executable, "-c", head.format(uri=c.nbd_uri(0, "m"))]),
                            capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    r = subprocess.run(c.client_cmd(resize + ["--size", "64M"]), capture_output=True, text=True, timeout=90)
    if r.returncode != 0 or "resized volume m" not in r.stdout:
        raise SystemExit(f"resize: failed: rc {r.returncode} {r.stdout} {r.stderr}")
    said = r.stdout.strip()
    size = next(v["size_bytes"] for v in c.status()["volumes"] if v["name"] == "m")
    if size != 64 << 20:
        raise SystemExit(f"resize: status says m is {size} bytes")
    check = """
import nbd, sys, time
deadline = time.monotonic() + 15
while True:
    h = nbd.NBD(); h.connect_uri({uri!r})
    if h.get_size() == 64 << 20:
        break
    if time.monotonic() > deadline:
        sys.exit(f"{uri} serves {{h.get_size()}} bytes")
    h.shutdown(); time.sleep(0.2)
block = bytes([{i}]) * 4096
h.pwrite(block, (48 << 20) + {i} * 4096, nbd.CMD_FLAG_FUA)
assert h.pread(4096, (48 << 20) + {i} * 4096) == block
print(h.pread(4096, 0).hex())
"""
    for i in range(3):
        r = subprocess.run(c.client_cmd([sys.executable, "-c", check.format(uri=c.nbd_uri(i, "m"), i=i + 1)]),
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or r.stdout.strip() != before:
            raise SystemExit(f"resize: node {i}: rc {r.returncode} {r.stderr[-2000:]}")
    print(json.dumps({"scenario": "resize", "shrink_refused": True, "said": said}), flush=True)


def drain_check(c: Cluster) -> None:
    """`stria cluster node-drain` (docs/design/cluster.md §6.6) through the real CLI: the node that
    owns m is drained while a client attached to it writes (FUA) without an error; it then owns
    nothing and is listed as cordoned (by `cluster status` and on the node page), a move to it is
    refused, and after `node-uncordon` a move to it succeeds."""
    node, _ = c.owner("m")
    i = int(node[1:])
    write = f"""
import nbd, sys, time
h = nbd.NBD(); h.connect_uri({c.nbd_uri(i, 'm')!r})
n, end = 0, time.monotonic() + 5
while time.monotonic() < end:
    n += 1
    h.pwrite(n.to_bytes(8, "little") * 512, 4096 * 7, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 4096 * 7) == n.to_bytes(8, "little") * 512
print(n)
"""
    writer = c.procs.start("drain-writer", c.client_cmd([sys.executable, "-c", write]), f"{c.work}/drain-writer.log")
    time.sleep(1)
    at = ["--etcd", c.endpoints]
    r = subprocess.run(c.client_cmd([c.stria, "cluster", "node-drain", node, "--reason", "maintenance"] + at),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or f"node {node} is drained" not in r.stdout:
        raise SystemExit(f"drain: failed: rc {r.returncode} {r.stdout} {r.stderr}")
    said = r.stdout.strip().splitlines()
    status = c.status()
    still = [v["name"] for v in status["volumes"] if v["owner"] == node]
    if still or [(x["node"], x["reason"]) for x in status["cordons"]] != [(node, "maintenance")]:
        raise SystemExit(f"drain: {node} still owns {still}; cordons {status['cordons']}")
    r = subprocess.run(c.client_cmd([c.stria, "cluster", "volume-move", "m", node] + at),
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 0 or "cordoned" not in r.stderr:
        raise SystemExit(f"drain: a move to the cordoned node was not refused: rc {r.returncode} {r.stderr}")
    c.check_page()
    if writer.wait(timeout=60) != 0:
        raise SystemExit(f"drain: the client at {node} saw an error (see {c.work}/drain-writer.log)")
    with open(f"{c.work}/drain-writer.log") as f:
        writes = int(f.read().split()[-1])
    r = subprocess.run(c.client_cmd([c.stria, "cluster", "node-uncordon", node] + at),
                       capture_output=True, text=True, timeout=30, check=True)
    if "in service again" not in r.stdout or c.status()["cordons"]:
        raise SystemExit(f"drain: uncordon: {r.stdout} {r.stderr}")
    r = subprocess.run(c.client_cmd([c.stria, "cluster", "volume-move", "m", node] + at),
                       capture_output=True, text=True, timeout=90)
    if r.returncode != 0:
        raise SystemExit(f"drain: a move back after the uncordon failed: {r.stdout} {r.stderr}")
    print(json.dumps({"scenario": "drain", "node": node, "writes_during": writes, "said": said}), flush=True)


def delete_check(c: Cluster) -> None:
    """`stria cluster volume-delete` (docs/design/cluster.md §6.4) through the real CLI: refused
    while a client holds the volume at a node, done once it let go; the volume's keys and slice
    claims are gone, and the other volume is still served."""
    hold = f"import nbd, time; h = nbd.NBD(); h.connect_uri({c.nbd_uri(0, 'e')!r}); time.sleep(120)"
    c.procs.start("holder", c.client_cmd([sys.executable, "-c", hold]), f"{c.work}/holder.log")
    delete = c.client_cmd([c.stria, "cluster", "volume-delete", "e", "--etcd", c.endpoints])
    deadline = time.monotonic() + 15
    while not any(v["name"] == "e" and v["clients"] > 0 for v in c.status()["volumes"]):
        if time.monotonic() > deadline:
            raise SystemExit("delete: the client holding e was not counted within 15 s")
        time.sleep(0.2)
    r = subprocess.run(delete, capture_output=True, text=True, timeout=90)
    if r.returncode == 0 or "clients attached" not in r.stderr:
        raise SystemExit(f"delete: not refused with a client attached: rc {r.returncode} {r.stdout} {r.stderr}")
    c.procs.signal("holder", signal.SIGTERM)
    c.procs.wait_gone("holder", 10)
    deadline = time.monotonic() + 15
    while True:
        r = subprocess.run(delete, capture_output=True, text=True, timeout=90)
        if r.returncode == 0:
            said = r.stdout.strip()
            break
        if "clients attached" not in r.stderr or time.monotonic() > deadline:
            raise SystemExit(f"delete: failed: rc {r.returncode} {r.stdout} {r.stderr}")
        time.sleep(0.5)  # the node counts the client gone at its next look
    names = [v["name"] for v in c.status()["volumes"]]
    if "e" in names or "m" not in names:
        raise SystemExit(f"delete: volumes after deleting e: {names}")
    r = subprocess.run(c.client_cmd(["etcdctl", "--endpoints", c.endpoints, "get", "--prefix", "/stria/v1/"]),
                       capture_output=True, text=True, timeout=30, check=True)
    left = [k for k in r.stdout.splitlines() if "/volumes/e/" in k or k.endswith("/owners/e") or k == "e"]
    if left:
        raise SystemExit(f"delete: keys of e left in etcd: {left}")
    c.wait_owner("m", 30)
    print(json.dumps({"scenario": "delete", "refused_with_client": True, "said": said}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
