#!/usr/bin/python3
"""roster side by side with Serf and etcd, counted the same way for all three.

Run it through `bench/compare` (which installs what it needs and builds roster); see
bench/README.md. Every node runs in its own network namespace, joined to a bridge by a veth
pair; what a node sends is what crosses its veth, read from the host side's counters, and
the connections it opens or takes are SYNs counted by nftables inside its namespace. Every
change is made over one open client connection per node (a driver process in the node's
namespace) and seen through each node's own change stream (roster: `roster watch`;
etcd: `etcdctl watch`; Serf: its agent's log, the only per-update signal Serf gives without
its 3-second event coalescing), time-stamped as each line arrives.

Also the Serf and etcd drivers:  compare.py driver-serf RPC_ADDR | driver-etcd URL LEASE_HEX
"""

import argparse
import base64
import json
import os
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
import http.client

BRIDGE = "cmpbr"
HOST_IP = "10.78.0.1"
NS_PREFIX = "cmp-"
STATE_FILE = "/tmp/bench-compare.state"
MAX_NODES = 20
SERVER_IPS = {f"s{i}": f"10.78.0.{2 + i}" for i in range(3)}
# n0 ... n19 at 10.78.0.10-29: above the bridge (.1) and etcd's servers (.2-4)
NODE_IPS = {f"n{i}": f"10.78.0.{10 + i}" for i in range(MAX_NODES)}
ALL_IPS = {**SERVER_IPS, **NODE_IPS}
LEASE_S = 30  # roster's default lease; the etcd clients' lease TTL too


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"compare: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def now_ns():
    return time.time_ns()


def run(*args, check=True, ns=None, capture=True, timeout=30):
    cmd = list(args)
    if ns is not None:
        cmd = ["ip", "netns", "exec", NS_PREFIX + ns] + cmd
    r = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stderr or '').strip()}")
    return r


# ---- processes ---------------------------------------------------------------------------

class Proc:
    """A process in a namespace, stopped by its pid. With `lines`, every stdout line is kept
    with the wall-clock time it arrived."""

    live = {}  # pid -> Proc
    lock = threading.Lock()

    def __init__(self, name, ns, args, logdir, lines=False, stdin=False, on_line=None):
        self.name = name
        self.ns = ns
        self.lines = []
        self.on_line = on_line
        cmd = ["ip", "netns", "exec", NS_PREFIX + ns] + list(args)
        self.errf = open(os.path.join(logdir, f"{name}.err"), "ab")
        out = subprocess.PIPE if lines else open(os.path.join(logdir, f"{name}.out"), "ab")
        self.copy = open(os.path.join(logdir, f"{name}.out"), "a") if lines else None
        self.p = subprocess.Popen(
            cmd, stdout=out, stderr=self.errf,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            text=True, bufsize=1, start_new_session=True)
        self.pid = self.p.pid  # `ip netns exec` execs the command: this is its pid
        with Proc.lock:
            Proc.live[self.pid] = self
        with open(STATE_FILE, "a") as f:
            f.write(f"{self.pid} {logdir}\n")
        if lines:
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            t = now_ns()
            line = line.rstrip("\n")
            self.lines.append((t, line))
            self.copy.write(f"{t} {line}\n")
            if self.on_line:
                self.on_line(t, line)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def alive(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, wait_s=5.0):
        if self.p.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.p.wait()
        with Proc.lock:
            Proc.live.pop(self.pid, None)
        self.errf.close()
        if self.copy:
            if self.reader.is_alive():
                self.reader.join(timeout=1)
            self.copy.close()

    def kill(self):
        self.stop(signal.SIGKILL)

    @staticmethod
    def stop_all():
        with Proc.lock:
            procs = list(Proc.live.values())
        for p in procs:
            p.stop(signal.SIGKILL)


def proc_cpu_s(pid):
    """User + system CPU seconds of a process (and its reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks
    except (OSError, IndexError, ValueError):
        return float("nan")


def proc_rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# ---- network -----------------------------------------------------------------------------

class Net:
    """A bridge on the host and one namespace per node, each with a veth pair; SYN counters
    in each namespace."""

    def __init__(self, names):
        self.names = names
        self.silenced = {}  # name -> how its link was silenced

    def clear(self):
        r = run("ip", "netns", "list", check=False)
        for line in r.stdout.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(NS_PREFIX):
                pids = run("ip", "netns", "pids", ns, check=False).stdout.split()
                for pid in pids:
                    log(f"killing leftover process {pid} in namespace {ns}")
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                run("ip", "netns", "del", ns, check=False)
        for name in ALL_IPS:
            run("ip", "link", "del", f"cmpv-{name}", check=False)
        run("ip", "link", "del", BRIDGE, check=False)

    def up(self):
        self.clear()
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for name in self.names:
            ns = NS_PREFIX + name
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", f"cmpv-{name}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", f"cmpv-{name}", "master", BRIDGE, "up")
            run("ip", "addr", "add", f"{ALL_IPS[name]}/24", "dev", "eth0", ns=name)
            run("ip", "link", "set", "eth0", "up", ns=name)
            run("ip", "link", "set", "lo", "up", ns=name)
            rules = (
                "table inet cmp {\n"
                " chain out { type filter hook output priority 0; policy accept;\n"
                '  oifname "eth0" tcp flags & (syn | ack) == syn counter\n }\n'
                " chain in { type filter hook input priority 0; policy accept;\n"
                '  iifname "eth0" tcp flags & (syn | ack) == syn counter\n }\n'
                "}\n")
            r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"nft in {ns}: {r.stderr.strip()}")
        # every namespace reaches every other through the bridge
        for name in self.names:
            other = self.names[0] if name != self.names[0] else HOST_IP
            target = ALL_IPS.get(other, other)
            if run("ping", "-c", "1", "-W", "2", target, ns=name, check=False).returncode != 0:
                raise RuntimeError(
                    f"namespace {name} cannot reach {target} over the bridge {BRIDGE}; "
                    "is bridged traffic filtered (br_netfilter with a DROP forward policy)?")

    def silence(self, name):
        """Make a node's link drop everything, both ways, without a FIN or a RST: nftables
        drop rules in its namespace (IP and ARP, before the SYN counters); where nft cannot,
        the host side of its veth set down (the bridge then drops what is sent to it).
        Returns how."""
        rules = (
            "table inet cmpsilent {\n"
            " chain in { type filter hook input priority -10; policy accept;\n"
            '  iifname "eth0" drop\n }\n'
            " chain out { type filter hook output priority -10; policy accept;\n"
            '  oifname "eth0" drop\n }\n'
            "}\n"
            "table arp cmpsilent {\n"
            " chain in { type filter hook input priority -10; policy drop;\n }\n"
            " chain out { type filter hook output priority -10; policy drop;\n }\n"
            "}\n")
        r = subprocess.run(["ip", "netns", "exec", NS_PREFIX + name, "nft", "-f", "-"], input=rules,
                           capture_output=True, text=True)
        if r.returncode == 0:
            self.silenced[name] = "nft"
            return "nft drop rules in its namespace"
        log(f"nft drop rules in {name} failed ({r.stderr.strip()}); setting its veth down instead")
        run("ip", "link", "set", f"cmpv-{name}", "down")
        self.silenced[name] = "link"
        return "its veth set down on the host"

    def unsilence(self, name):
        how = self.silenced.pop(name, None)
        if how == "nft":
            # both tables in one transaction: the link returns at once, not IP before ARP
            subprocess.run(["ip", "netns", "exec", NS_PREFIX + name, "nft", "-f", "-"],
                           input="delete table inet cmpsilent\ndelete table arp cmpsilent\n",
                           capture_output=True, text=True, check=True)
        elif how == "link":
            run("ip", "link", "set", f"cmpv-{name}", "up")

    def counters(self, name):
        """What the node sent and received: the host side's rx is the node's tx."""
        base = f"/sys/class/net/cmpv-{name}/statistics/"

        def rd(f):
            with open(base + f) as fh:
                return int(fh.read())
        return {"tx_bytes": rd("rx_bytes"), "tx_pkts": rd("rx_packets"),
                "rx_bytes": rd("tx_bytes"), "rx_pkts": rd("tx_packets")}

    def syns(self, name):
        r = run("nft", "list", "table", "inet", "cmp", ns=name)
        counts = [int(m) for m in re.findall(r"counter packets (\d+)", r.stdout)]
        return {"syn_out": counts[0], "syn_in": counts[1]}

    def snapshot(self, names):
        return {n: {**self.counters(n), **self.syns(n)} for n in names}


def diff(a, b):
    return {n: {k: b[n][k] - a[n][k] for k in a[n]} for n in a}


# ---- statistics --------------------------------------------------------------------------

def med_max(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return (statistics.median(xs), max(xs))


# ---- the systems -------------------------------------------------------------------------

class System:
    """What every system offers the measurements."""
    name = "?"
    servers = []  # namespaces of servers that are not nodes (etcd)

    def __init__(self, n, work, args):
        self.n = n
        self.nodes = [f"n{i}" for i in range(n)]
        self.work = work
        self.args = args
        self.events = {node: [] for node in self.nodes}   # (t, key, value) per node
        self.member_events = {node: [] for node in self.nodes}  # (t, kind, who)
        self.down_events = {node: [] for node in self.nodes}  # (t, key): a registration gone
        self.drivers = {}
        self.acks = {}  # (key, value) -> (sent, acked)
        self.errors = []

    def on_ack(self, t, line):
        parts = line.split()
        if parts and parts[0] == "error":
            self.errors.append(line)
        elif len(parts) == 4:
            self.acks[(parts[0], parts[1])] = (int(parts[2]), int(parts[3]))

    def start_driver(self, node):
        raise NotImplementedError

    def change(self, node, key, value):
        self.drivers[node].send(f"{key} {value}")

    def node_pids(self, node):
        raise NotImplementedError

    def server_pids(self):
        return {}

    def all_pids(self):
        return {**{n: self.node_pids(n) for n in self.nodes}, **self.server_pids()}

    def seen(self, node, key, value, since):
        for (t, k, v) in list(self.events[node]):
            if k == key and (v is None or v == value) and t >= since:
                return t
        return None

    def member_seen(self, observer, kind, who, since):
        """When `observer` first showed member `who` alive or gone after `since`, or None."""
        for (t, k, w) in list(self.member_events[observer]):
            if k == kind and w == who and t >= since:
                return t
        return None

    def gone_parts(self, observer, victim, key, since):
        """When `observer` showed `victim` gone after `since`: its membership, and its
        registration `key` (None where not shown yet)."""
        down = [t for (t, k) in list(self.down_events[observer]) if k == key and t >= since]
        return {"membership": self.member_seen(observer, "gone", victim, since),
                "registration": min(down) if down else None}

    def after_silence(self, node):
        """What a node's client must do once its link is back (nothing, unless it lost its lease)."""

    def stop(self):
        Proc.stop_all()


class Roster(System):
    name = "roster"

    def __init__(self, n, work, args):
        super().__init__(n, work, args)
        self.agents = {}
        self.watches = {}
        self.secret = os.path.join(work, "secret")
        # Readable by its owner only: roster refuses a secret file others can read.
        fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
        self.ids = {}

    def agent_args(self, node):
        ip = NODE_IPS[node]
        a = [self.args.roster_bin, "agent", "--listen", "0.0.0.0:7420",
             "--advertise", f"ws://{ip}:7420", "--node-name", node,
             "--data-dir", os.path.join(self.work, node), "--cluster-secret-file", self.secret]
        if node != "n0":
            a += ["--join", f"ws://{NODE_IPS['n0']}:7420"]
        if self.args.zones > 1:
            a += ["--zone", f"zone-{int(node[1:]) % self.args.zones}"]
        return a

    def cli(self, node, *args):
        return run(self.args.roster_bin, *args, "--agent", "ws://127.0.0.1:7420", ns=node, check=False)

    def start_node(self, node):
        self.agents[node] = Proc(f"{node}-agent", node, self.agent_args(node), self.work)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.cli(node, "status", "--json").returncode == 0:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"roster agent on {node} did not answer within 10 s")
        self.start_watches(node)

    def start_watches(self, node):
        ev, mev, down = self.events[node], self.member_events[node], self.down_events[node]

        def on_bench(t, line):
            try:
                e = json.loads(line)
            except ValueError:
                return
            if e.get("event") == "up":
                ev.append((t, e["instance"], e.get("meta", {}).get("seq")))
            elif e.get("event") == "down":
                down.append((t, e["instance"]))

        def on_members(t, line):
            try:
                e = json.loads(line)
            except ValueError:
                return
            who = e.get("meta", {}).get("name", e.get("instance"))
            mev.append((t, "alive" if e.get("event") == "up" else "gone", who))
        url = "ws://127.0.0.1:7420"
        self.watches[node] = [
            Proc(f"{node}-watch", node, [self.args.roster_bin, "watch", "bench", "--json", "--agent", url],
                 self.work, lines=True, on_line=on_bench),
            Proc(f"{node}-watch-members", node,
                 [self.args.roster_bin, "watch", "roster", "--json", "--agent", url],
                 self.work, lines=True, on_line=on_members)]

    def start(self):
        for node in self.nodes:
            self.start_node(node)
        deadline = time.time() + 30
        while time.time() < deadline:
            if all(self.alive_members(node) >= self.n for node in self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError("roster: the cluster did not form within 30 s")

    def alive_members(self, node):
        r = self.cli(node, "members", "--json")
        if r.returncode != 0:
            return 0
        try:
            return sum(1 for m in json.loads(r.stdout) if m.get("state") == "alive")
        except ValueError:
            return 0

    def start_driver(self, node):
        self.drivers[node] = Proc(f"{node}-driver", node, [self.args.roster_driver, "ws://127.0.0.1:7420"],
                                  self.work, lines=True, stdin=True, on_line=self.on_ack)

    def node_pids(self, node):
        return [self.agents[node].pid]

    def kill_node(self, node):
        for p in [self.agents[node], self.drivers.get(node)] + self.watches[node]:
            if p:
                p.kill()

    def restart_node(self, node):
        self.agents[node] = Proc(f"{node}-agent", node, self.agent_args(node), self.work)

    def after_restart(self, node):
        deadline = time.time() + 10
        while time.time() < deadline and self.cli(node, "status", "--json").returncode != 0:
            time.sleep(0.05)
        self.start_watches(node)
        self.start_driver(node)


class Serf(System):
    name = "serf"

    def __init__(self, n, work, args):
        super().__init__(n, work, args)
        self.agents = {}
        self.snapshot_peers = []  # per restart: other members its snapshot named

    def agent_args(self, node):
        ip = NODE_IPS[node]
        a = ["serf", "agent", "-node", node, "-bind", f"{ip}:7946", "-rpc-addr", "127.0.0.1:7373",
             "-snapshot", os.path.join(self.work, f"{node}.snapshot"), "-rejoin",
             "-tag", "c=0", "-log-level", "info"]
        if node != "n0":
            a += ["-join", f"{NODE_IPS['n0']}:7946"]
        return a

    def start_node(self, node):
        ev, mev = self.events[node], self.member_events[node]
        pat = re.compile(r"serf: Event(Member\w+): (\S+)")

        def on_line(t, line):
            m = pat.search(line)
            if not m:
                return
            kind, who = m.group(1), m.group(2)
            if kind == "MemberUpdate":
                ev.append((t, who, None))
            elif kind == "MemberJoin":
                mev.append((t, "alive", who))
            elif kind in ("MemberFailed", "MemberLeave"):
                mev.append((t, "gone", who))
        self.agents[node] = Proc(f"{node}-agent", node, self.agent_args(node), self.work,
                                 lines=True, on_line=on_line)

    def alive_members(self, node):
        r = run("serf", "members", "-rpc-addr", "127.0.0.1:7373", "-status", "alive", ns=node, check=False)
        return len(r.stdout.strip().splitlines()) if r.returncode == 0 else 0

    def start(self):
        for node in self.nodes:
            self.start_node(node)
            deadline = time.time() + 10
            while time.time() < deadline and self.alive_members(node) < 1:
                time.sleep(0.05)
        deadline = time.time() + 30
        while time.time() < deadline:
            if all(self.alive_members(node) >= self.n for node in self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError("serf: the cluster did not form within 30 s")

    def start_driver(self, node):
        self.drivers[node] = Proc(f"{node}-driver", node,
                                  [sys.executable, os.path.abspath(__file__), "driver-serf", "127.0.0.1:7373"],
                                  self.work, lines=True, stdin=True, on_line=self.on_ack)

    def change(self, node, key, value):
        # Serf has one tag map per node (512 bytes in all): a change sets tag `c`.
        self.drivers[node].send(f"{node} {value}")

    def seen(self, node, key, value, since):
        # the agent logs an update of the origin's tags, not the value: the first update of
        # the origin after the change was sent (exact for one change at a time)
        return super().seen(node, key, None, since)

    def gone_parts(self, observer, victim, key, since):
        # a Serf node's data (its tags) is part of its membership: nothing else to go
        return {"membership": self.member_seen(observer, "gone", victim, since)}

    def node_pids(self, node):
        return [self.agents[node].pid]

    def kill_node(self, node):
        for p in [self.agents[node], self.drivers.get(node)]:
            if p:
                p.kill()

    def restart_node(self, node):
        # What Serf's snapshot kept through the SIGKILL: the other members it names.
        names = set()
        try:
            with open(os.path.join(self.work, f"{node}.snapshot")) as f:
                for line in f:
                    if line.startswith("alive: "):
                        names.add(line.split()[1])
        except OSError:
            pass
        self.snapshot_peers.append(len(names - {node}))
        self.start_node(node)

    def after_restart(self, node):
        deadline = time.time() + 10
        while time.time() < deadline and self.alive_members(node) < 1:
            time.sleep(0.05)
        self.start_driver(node)


class Etcd(System):
    """Three etcd servers (their own namespaces) and one client per node: a lease kept alive
    by `etcdctl lease keep-alive`, the node's key put under it, and `etcdctl watch`."""
    name = "etcd"
    servers = ["s0", "s1", "s2"]

    def __init__(self, n, work, args):
        super().__init__(n, work, args)
        self.srv = {}
        self.keepalive = {}
        self.watches = {}
        self.leases = {}
        self.endpoints = ",".join(f"http://{SERVER_IPS[s]}:2379" for s in self.servers)

    def server_args(self, s):
        ip = SERVER_IPS[s]
        cluster = ",".join(f"{x}=http://{SERVER_IPS[x]}:2380" for x in self.servers)
        return ["etcd", "--name", s, "--data-dir", os.path.join(self.work, s),
                "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
                "--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379",
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "compare", "--log-level", "warn"]

    def ctl(self, node, *args, check=True):
        return run("etcdctl", "--endpoints", self.endpoints, *args, ns=node, check=check,
                   capture=True)

    def server_for(self, node):
        return f"http://{SERVER_IPS[self.servers[int(node[1:]) % 3]]}:2379"

    def start(self):
        for s in self.servers:
            self.srv[s] = Proc(f"{s}-etcd", s, self.server_args(s), self.work)
        deadline = time.time() + 30
        while time.time() < deadline:
            r = self.ctl("n0", "endpoint", "health", check=False)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("etcd: the servers did not become healthy within 30 s")
        for node in self.nodes:
            self.start_client(node)

    def start_client(self, node):
        r = self.ctl(node, "lease", "grant", str(LEASE_S))
        m = re.search(r"lease ([0-9a-f]+) granted", r.stdout)
        if not m:
            raise RuntimeError(f"etcd: no lease for {node}: {r.stdout} {r.stderr}")
        lease = m.group(1)
        self.leases[node] = lease
        self.ctl(node, "put", f"/services/bench/{node}", "0", "--lease", lease)
        self.keepalive[node] = Proc(f"{node}-keepalive", node,
                                    ["etcdctl", "--endpoints", self.endpoints, "lease", "keep-alive", lease],
                                    self.work)
        ev, mev, down = self.events[node], self.member_events[node], self.down_events[node]
        state = {"op": None, "key": None}

        def on_line(t, line):
            # etcdctl watch prints PUT|DELETE, then the key, then the value
            if state["op"] is None:
                if line in ("PUT", "DELETE"):
                    state["op"] = line
                return
            if state["key"] is None:
                state["key"] = line
                if state["op"] == "DELETE":
                    who = line.rsplit("/", 1)[-1]
                    down.append((t, who))
                    if who.startswith("n"):
                        mev.append((t, "gone", who))
                    state["op"] = state["key"] = None
                return
            key = state["key"].rsplit("/", 1)[-1]
            ev.append((t, key, line))
            if key.startswith("n"):
                mev.append((t, "alive", key))
            state["op"] = state["key"] = None
        self.watches[node] = Proc(f"{node}-watch", node,
                                  ["etcdctl", "--endpoints", self.endpoints, "watch", "--prefix",
                                   "/services/bench/"], self.work, lines=True, on_line=on_line)
        time.sleep(0.2)

    def start_driver(self, node):
        self.drivers[node] = Proc(f"{node}-driver", node,
                                  [sys.executable, os.path.abspath(__file__), "driver-etcd",
                                   self.server_for(node), self.leases[node]],
                                  self.work, lines=True, stdin=True, on_line=self.on_ack)

    def node_pids(self, node):
        return [self.keepalive[node].pid, self.watches[node].pid]

    def server_pids(self):
        return {s: [p.pid] for s, p in self.srv.items()}

    def kill_node(self, node):
        for p in [self.keepalive[node], self.watches[node], self.drivers.get(node)]:
            if p:
                p.kill()

    def restart_node(self, node):
        self.start_client(node)

    def after_silence(self, node):
        # Its lease ended while it was cut off (the servers deleted its key, and its old
        # keep-alive has nothing left to renew): like any etcd client, it must take a new
        # lease and put its key again.
        self.kill_node(node)
        self.restart_node(node)
        self.after_restart(node)

    def after_restart(self, node):
        self.start_driver(node)


# ---- the drivers (run inside a node's namespace) -----------------------------------------

def driver_serf(rpc_addr):
    import msgpack
    host, port = rpc_addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    unpacker = msgpack.Unpacker(raw=False)
    seq = 0

    def call(command, body):
        nonlocal seq
        seq += 1
        sock.sendall(msgpack.packb({"Command": command, "Seq": seq}) + msgpack.packb(body))
        while True:
            for header in unpacker:
                return header
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("serf agent hung up")
            unpacker.feed(data)
    h = call("handshake", {"Version": 1})
    if h.get("Error"):
        raise RuntimeError(h["Error"])
    for line in sys.stdin:
        parts = line.split()
        if len(parts) < 2:
            continue
        key, value = parts[0], parts[1]
        sent = now_ns()
        h = call("tags", {"Tags": {"c": value}, "DeleteTags": []})
        acked = now_ns()
        if h.get("Error"):
            print(f"error {key} {value} {h['Error']}", flush=True)
        else:
            print(f"{key} {value} {sent} {acked}", flush=True)


def driver_etcd(url, lease_hex):
    host = url.split("//", 1)[1]
    conn = http.client.HTTPConnection(host, timeout=30)
    lease = int(lease_hex, 16)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) < 2:
            continue
        key, value = parts[0], parts[1]
        body = json.dumps({"key": base64.b64encode(f"/services/bench/{key}".encode()).decode(),
                           "value": base64.b64encode(value.encode()).decode(), "lease": lease})
        sent = now_ns()
        try:
            conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            acked = now_ns()
            if r.status != 200:
                print(f"error {key} {value} HTTP {r.status} {data[:200]!r}", flush=True)
                continue
        except (OSError, http.client.HTTPException) as e:
            print(f"error {key} {value} {e}", flush=True)
            conn = http.client.HTTPConnection(host, timeout=30)
            continue
        print(f"{key} {value} {sent} {acked}", flush=True)


# ---- the measurements --------------------------------------------------------------------

def wait_seen(system, key, value, since, timeout_s, nodes=None):
    """Until every node shows (key, value): the latest time it was seen, or None."""
    nodes = nodes or system.nodes
    deadline = time.time() + timeout_s
    while True:
        ts = [system.seen(n, key, value, since) for n in nodes]
        if all(t is not None for t in ts):
            return max(ts)
        if time.time() > deadline:
            return None
        time.sleep(0.002)


def wait_ack(system, key, value, timeout_s=10):
    deadline = time.time() + timeout_s
    while (key, value) not in system.acks:
        if time.time() > deadline:
            raise RuntimeError(f"{system.name}: no answer to change {key}={value}; errors: {system.errors[-3:]}")
        time.sleep(0.001)
    return system.acks[(key, value)]


def measure_propagation(system, trials):
    """Per trial: until every node shows the change, until the origin answered the write,
    and until the first node other than the origin shows it (ms)."""
    out = []
    for i in range(trials):
        origin = system.nodes[i % system.n]
        key, value = f"p{i}", str(1000 + i)
        if system.name == "serf":
            key = origin
        system.change(origin, key, value)
        sent, acked = wait_ack(system, key, value)
        seen = wait_seen(system, key, value, sent, 5)
        others = [system.seen(n, key, value, sent) for n in system.nodes if n != origin]
        others = [t for t in others if t is not None]
        out.append({"all": None if seen is None else (seen - sent) / 1e6,
                    "ack": (acked - sent) / 1e6,
                    "first": (min(others) - sent) / 1e6 if others else None})
        time.sleep(0.15)
    return out


def cpu_of(pids):
    return sum(proc_cpu_s(p) for p in pids)


def measure_idle(system, net, window_s):
    pids = system.all_pids()
    names = list(pids)
    cpu0 = {n: cpu_of(pids[n]) for n in names}
    c0 = net.snapshot(names)
    time.sleep(window_s)
    c1 = net.snapshot(names)
    cpu1 = {n: cpu_of(pids[n]) for n in names}
    d = diff(c0, c1)
    per_min = 60.0 / window_s
    res = {}
    for n in names:
        res[n] = {"bytes_min": d[n]["tx_bytes"] * per_min, "pkts_min": d[n]["tx_pkts"] * per_min,
                  "cpu_ms_min": (cpu1[n] - cpu0[n]) * 1000 * per_min,
                  "rss_mib": sum(proc_rss_mib(p) for p in pids[n])}
    return res


def measure_restart(system, net, node, window_s, delay_s):
    others = [n for n in system.nodes if n != node]
    system.kill_node(node)
    t_kill = now_ns()
    time.sleep(delay_s)
    c0 = net.snapshot([node])
    t_start = now_ns()
    system.restart_node(node)
    system.after_restart(node)
    remaining = window_s - (now_ns() - t_start) / 1e9
    if remaining > 0:
        time.sleep(remaining)
    c1 = net.snapshot([node])
    d = diff(c0, c1)[node]
    gone = [o for o in others
            if any(k == "gone" and w == node and t >= t_kill for (t, k, w) in system.member_events[o])]
    alive_ts = []
    for o in others:
        ts = [t for (t, k, w) in system.member_events[o] if k == "alive" and w == node and t >= t_start]
        alive_ts.append(min(ts) if ts else None)
    back_ms = None
    if all(t is not None for t in alive_ts):
        back_ms = (max(alive_ts) - t_start) / 1e6
    return {"bytes": d["tx_bytes"], "pkts": d["tx_pkts"], "conns": d["syn_out"] + d["syn_in"],
            "syn_out": d["syn_out"], "syn_in": d["syn_in"], "shown_gone": len(gone), "back_ms": back_ms}


def mark(system, victim, key):
    """A registration of the victim's own (Serf: its tags), seen by every node, so that its
    going can be timed too."""
    system.change(victim, key, "1")
    sent, _ = wait_ack(system, key, "1")
    if wait_seen(system, key, "1", sent, 10) is None:
        raise RuntimeError(f"{system.name}: {key} from {victim} not seen by every node within 10 s")


def wait_gone(system, victim, key, since, timeout_s):
    """Until every other node shows `victim` gone, every part of it (membership,
    registration): per part, when the last node showed it (ms after `since`; None if some
    node did not within the timeout); `gone_ms` is the latest part."""
    others = [n for n in system.nodes if n != victim]
    deadline = time.time() + timeout_s
    while True:
        parts = {o: system.gone_parts(o, victim, key, since) for o in others}
        complete = [o for o in others if all(t is not None for t in parts[o].values())]
        if len(complete) == len(others) or time.time() > deadline:
            break
        time.sleep(0.05)
    res = {"shown_gone": len(complete)}
    for part in parts[others[0]]:
        ts = [parts[o][part] for o in others]
        res[f"{part}_ms"] = None if None in ts else (max(ts) - since) / 1e6
    ms = [v for k, v in res.items() if k.endswith("_ms")]
    res["gone_ms"] = None if None in ms else max(ms)
    return res


def wait_back(system, victim, since, timeout_s):
    """Until every other node shows `victim` a member again: ms after `since` (None if some
    node did not within the timeout), and the other nodes that did not show it back."""
    others = [n for n in system.nodes if n != victim]
    deadline = time.time() + timeout_s
    while True:
        ts = [system.member_seen(o, "alive", victim, since) for o in others]
        if None not in ts:
            return (max(ts) - since) / 1e6, []
        if time.time() > deadline:
            return None, [o for o, t in zip(others, ts) if t is None]
        time.sleep(0.05)


def measure_death(system, victim, key, timeout_s):
    """SIGKILL a node and time until every other node shows it gone; then start it again
    with its data, so that the later phases have every node."""
    mark(system, victim, key)
    t_kill = now_ns()
    system.kill_node(victim)
    res = wait_gone(system, victim, key, t_kill, timeout_s)
    t_start = now_ns()
    system.restart_node(victim)
    system.after_restart(victim)
    res["back_ms"], res["not_back"] = wait_back(system, victim, t_start, timeout_s)
    return res


def measure_silent(system, net, victim, key, timeout_s):
    """Silence a node's link (no FIN, no RST: its packets vanish) and time until every other
    node shows it gone; then give the link back and time until every other node shows it a
    member again."""
    mark(system, victim, key)
    how = net.silence(victim)
    t_silent = now_ns()
    try:
        res = wait_gone(system, victim, key, t_silent, timeout_s)
    finally:
        # timed from before the rules go: a fast rejoin can be shown before nft returns
        t_back = now_ns()
        net.unsilence(victim)
    system.after_silence(victim)
    res["back_ms"], res["not_back"] = wait_back(system, victim, t_back, timeout_s)
    # whether its registration came back too (Serf: its tags are its membership)
    res["registration_back"] = sum(1 for o in system.nodes if o != victim
                                   and system.seen(o, key, "1", t_back) is not None)
    res["how"] = how
    return res


def measure_churn(system, net, preload, rate, seconds):
    names = list(system.all_pids())
    res = {"preload_s": None}
    if preload and system.name != "serf":
        t0 = time.time()
        for i in range(preload):
            owner = system.nodes[i % system.n]
            system.change(owner, f"c{i}", "0")
        last = f"c{preload - 1}"
        if wait_seen(system, last, "0", 0, 120) is None:
            raise RuntimeError(f"{system.name}: the preload did not reach every node within 120 s")
        for i in range(preload):
            wait_ack(system, f"c{i}", "0", 60)
        for i in range(preload):
            if wait_seen(system, f"c{i}", "0", 0, 60) is None:
                raise RuntimeError(f"{system.name}: registration c{i} did not reach every node")
        res["preload_s"] = time.time() - t0
        time.sleep(2)
    pids = system.all_pids()
    cpu0 = {n: cpu_of(pids[n]) for n in names}
    c0 = net.snapshot(names)
    changes = []
    start = time.time()
    total = int(rate * seconds)
    for j in range(total):
        target = start + j / rate
        delay = target - time.time()
        if delay > 0:
            time.sleep(delay)
        i = j % max(preload, 1)
        owner = system.nodes[i % system.n]
        key, value = f"c{i}", str(j + 1)
        if system.name == "serf":
            key = owner
        system.change(owner, key, value)
        changes.append((key, value))
    end_ns = now_ns()  # the churn's end: answers after it are the backlog
    # let the last changes arrive, then stop counting
    time.sleep(2)
    elapsed = time.time() - start
    c1 = net.snapshot(names)
    cpu1 = {n: cpu_of(pids[n]) for n in names}
    d = diff(c0, c1)
    lags, missing = [], 0
    # index events per node by (key, value) for the lookup
    idx = {}
    for n in system.nodes:
        m = {}
        for (t, k, v) in system.events[n]:
            m.setdefault((k, v), []).append(t)
        idx[n] = m
    for (key, value) in changes:
        ack = system.acks.get((key, value))
        if ack is None:
            missing += 1
            continue
        sent = ack[0]
        worst = 0
        for n in system.nodes:
            if system.name == "serf":
                ts = [t for t in idx[n].get((key, None), []) if t >= sent]
            else:
                ts = [t for t in idx[n].get((key, value), []) if t >= sent]
            if not ts:
                worst = None
                break
            worst = max(worst, min(ts) - sent)
        if worst is None:
            missing += 1
        else:
            lags.append(worst / 1e6)
    per_min = 60.0 / elapsed
    res.update({
        "sent": len(changes), "acked": sum(1 for c in changes if c in system.acks),
        "answered_per_s": sum(1 for c in changes if c in system.acks and system.acks[c][1] <= end_ns)
        / (end_ns / 1e9 - start),
        "not_seen": missing, "lag_ms": med_max(lags),
        "bytes_min": {n: d[n]["tx_bytes"] * per_min for n in names},
        "rx_bytes_change": {n: d[n]["rx_bytes"] / max(len(changes), 1) for n in names},
        "rx_pkts_change": {n: d[n]["rx_pkts"] / max(len(changes), 1) for n in names},
        "cpu_ms_min": {n: (cpu1[n] - cpu0[n]) * 1000 * per_min for n in names},
        "rss_mib": {n: sum(proc_rss_mib(p) for p in pids[n]) for n in names},
    })
    return res


# roster's member lease (protocol/src/proto/config.rs and ownership.rs): the larger of
# 60 s and 24 s per member (members rounded up to a power of two), renewed at a quarter to
# a third of it.
MEMBER_LEASE_S, LEASE_PER_MEMBER_S = 60, 24


def renewal_period_s(n):
    members = 1 << max(0, (n - 1).bit_length())
    return max(MEMBER_LEASE_S, members * LEASE_PER_MEMBER_S) / 3


def steady_window(n, args):
    """When the steady idle window opens (seconds after the cluster's start) and how long
    it lasts: by default after every node's first renewal, for a whole renewal period, so
    the window holds what a quiet cluster sends, not its forming. Every system gets the
    same window."""
    period = renewal_period_s(n)
    warmup = period + 10 if args.warmup == "auto" else float(args.warmup)
    window = max(20.0, period) if args.idle == "auto" else float(args.idle)
    return warmup, window


def window_how(args):
    sizes = ", ".join(f"{n} nodes: {w:.0f} s from {s:.0f} s after the start"
                      for n in args.nodes for s, w in [steady_window(n, args)])
    return f"the steady window ({sizes})"


def run_system(cls, n, args, net):
    work = tempfile.mkdtemp(prefix=f"bench-compare.{cls.name}{n}.")
    os.chmod(work, 0o755)
    system = cls(n, work, args)
    log(f"{cls.name}, {n} nodes: starting (logs in {work})")
    result = {"system": cls.name, "n": n}
    try:
        t = time.time()
        system.start()
        result["form_s"] = time.time() - t
        for node in system.nodes:
            system.start_driver(node)
        time.sleep(args.settle)
        log(f"{cls.name} {n}: propagation, {args.trials} changes")
        result["prop_ms"] = measure_propagation(system, args.trials)
        time.sleep(args.settle)
        log(f"{cls.name} {n}: idle while forming, for {args.form_idle} s")
        result["idle_form"] = measure_idle(system, net, args.form_idle)
        warmup, window = steady_window(n, args)
        time.sleep(max(args.settle, warmup - (time.time() - t)))
        log(f"{cls.name} {n}: idle in steady state ({warmup:.0f} s after the start), for {window:.0f} s")
        result["idle"] = measure_idle(system, net, window)
        restarts = []
        for r in range(args.restarts):
            node = system.nodes[-1 - (r % (n - 1))]
            log(f"{cls.name} {n}: SIGKILL and restart {node} ({r + 1}/{args.restarts}), {args.restart_window} s")
            restarts.append(measure_restart(system, net, node, args.restart_window, args.restart_delay))
            time.sleep(1)
        result["restart"] = restarts
        if isinstance(system, Serf):
            result["snapshot_peers"] = list(system.snapshot_peers)
        deaths = []
        for r in range(args.death_trials):
            node = system.nodes[1 + r % (n - 1)]  # never n0, the node every other joins
            key = node if isinstance(system, Serf) else f"dead{r}"
            log(f"{cls.name} {n}: SIGKILL {node} ({r + 1}/{args.death_trials}) until every other node "
                f"shows it gone (at most {args.gone_timeout} s), then restart it")
            deaths.append(measure_death(system, node, key, args.gone_timeout))
            time.sleep(args.settle)
        result["death"] = deaths
        silents = []
        for r in range(args.silent_trials):
            node = system.nodes[-1 - r % (n - 1)]
            key = node if isinstance(system, Serf) else f"mute{r}"
            log(f"{cls.name} {n}: silence {node}'s link ({r + 1}/{args.silent_trials}) until every other "
                f"node shows it gone (at most {args.gone_timeout} s), then give it back")
            silents.append(measure_silent(system, net, node, key, args.gone_timeout))
            time.sleep(args.settle)
        result["silent"] = silents
        if args.churn > 0:
            log(f"{cls.name} {n}: churn: {args.preload} registrations, then {args.rate}/s for {args.churn} s")
            result["churn"] = measure_churn(system, net, args.preload, args.rate, args.churn)
            # Stop the drivers: a Serf driver may still be working through changes it was
            # asked for faster than Serf answers them, and idle means no client asking.
            for d in list(system.drivers.values()):
                d.kill()
            time.sleep(max(args.settle, 2))
            log(f"{cls.name} {n}: idle again, with the registrations, for {window:.0f} s")
            result["idle_after"] = measure_idle(system, net, window)
        result["errors"] = system.errors[:5]
        if system.errors:
            log(f"{cls.name} {n}: {len(system.errors)} failed changes, first: {system.errors[0]}")
    except Exception as e:  # a failed system is reported, the others still run
        log(f"{cls.name} {n}: FAILED: {e}")
        result["failed"] = str(e)
    finally:
        system.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


# ---- the report --------------------------------------------------------------------------

def fmt(x, unit="", digits=1):
    if x is None:
        return "—"
    if isinstance(x, float) and x != x:
        return "—"
    if abs(x) >= 100:
        s = f"{x:,.0f}"
    else:
        s = f"{x:,.{digits}f}"
    return s + unit


def fmt_mm(mm, unit="", digits=1):
    if mm is None:
        return "—"
    if not isinstance(mm, tuple):
        return fmt(mm, unit, digits)
    return f"{fmt(mm[0], '', digits)} / {fmt(mm[1], '', digits)}{unit}"


def ratio(peer, ours):
    if peer is None or ours is None or ours == 0:
        return "—"
    return f"{peer / ours:,.1f}x"


def secs(ms):
    return None if ms is None else ms / 1000


def gone_figures(phase, xs, n):
    """The figures of a death or silent-link phase: when the node was gone everywhere (in
    all, its membership, its registration), on how many nodes, and whether it came back."""
    return {
        f"{phase}_gone": med_max([secs(x["gone_ms"]) for x in xs]),
        f"{phase}_membership": med_max([secs(x["membership_ms"]) for x in xs]),
        f"{phase}_registration": med_max([secs(x.get("registration_ms")) for x in xs]),
        f"{phase}_missing": sum(1 for x in xs if x["gone_ms"] is None),
        f"{phase}_shown": min(x["shown_gone"] for x in xs),
        f"{phase}_back_missing": sum(1 for x in xs if x["back_ms"] is None),
        f"{phase}_shown_back": n - 1 - max(len(x["not_back"]) for x in xs),
    }


def figures(r):
    """name -> (median, max) or a value, for one run."""
    f = {}
    if "failed" in r:
        return f
    n_nodes = [f"n{i}" for i in range(r["n"])]
    servers = [k for k in r["idle"] if k.startswith("s")]
    f["prop"] = med_max([x["all"] for x in r["prop_ms"]])
    f["prop_first"] = med_max([x["first"] for x in r["prop_ms"]])
    f["prop_ack"] = med_max([x["ack"] for x in r["prop_ms"]])
    f["prop_lost"] = sum(1 for x in r["prop_ms"] if x["all"] is None)
    form = r["idle_form"]
    f["form_idle_kb"] = med_max([form[n]["bytes_min"] / 1000 for n in n_nodes])
    f["form_idle_pkts"] = med_max([form[n]["pkts_min"] for n in n_nodes])
    idle = r["idle"]
    f["idle_kb"] = med_max([idle[n]["bytes_min"] / 1000 for n in n_nodes])
    f["idle_pkts"] = med_max([idle[n]["pkts_min"] for n in n_nodes])
    f["idle_cpu"] = med_max([idle[n]["cpu_ms_min"] for n in n_nodes])
    f["idle_rss"] = med_max([idle[n]["rss_mib"] for n in n_nodes])
    if servers:
        f["srv_idle_kb"] = med_max([idle[s]["bytes_min"] / 1000 for s in servers])
        f["srv_idle_pkts"] = med_max([idle[s]["pkts_min"] for s in servers])
        f["srv_idle_cpu"] = med_max([idle[s]["cpu_ms_min"] for s in servers])
        f["srv_idle_rss"] = med_max([idle[s]["rss_mib"] for s in servers])
    rs = r.get("restart", [])
    if rs:
        f["restart_kb"] = med_max([x["bytes"] / 1000 for x in rs])
        f["restart_conns"] = med_max([x["conns"] for x in rs])
        f["restart_gone"] = max(x["shown_gone"] for x in rs)
        f["restart_back"] = med_max([x["back_ms"] for x in rs])
        f["restart_back_missing"] = sum(1 for x in rs if x["back_ms"] is None)
    for phase in ("death", "silent"):
        xs = r.get(phase, [])
        if xs:
            f.update(gone_figures(phase, xs, r["n"]))
    ss = r.get("silent", [])
    if ss:
        f["silent_back"] = med_max([secs(x["back_ms"]) for x in ss])
        f["silent_reg_back"] = min(x["registration_back"] for x in ss)
    ia = r.get("idle_after")
    if ia:
        f["idle_after_kb"] = med_max([ia[n]["bytes_min"] / 1000 for n in n_nodes])
        f["idle_after_pkts"] = med_max([ia[n]["pkts_min"] for n in n_nodes])
        f["idle_after_cpu"] = med_max([ia[n]["cpu_ms_min"] for n in n_nodes])
        if servers:
            f["srv_idle_after_kb"] = med_max([ia[s]["bytes_min"] / 1000 for s in servers])
            f["srv_idle_after_pkts"] = med_max([ia[s]["pkts_min"] for s in servers])
    c = r.get("churn")
    if c:
        f["churn_kb"] = med_max([c["bytes_min"][n] / 1000 for n in n_nodes])
        f["churn_lag"] = c["lag_ms"]
        f["churn_rx_b"] = med_max([c["rx_bytes_change"][n] for n in n_nodes])
        f["churn_rx_pkts"] = med_max([c["rx_pkts_change"][n] for n in n_nodes])
        f["churn_rate"] = c["answered_per_s"]
        f["churn_cpu"] = med_max([c["cpu_ms_min"][n] for n in n_nodes])
        f["churn_rss"] = med_max([c["rss_mib"][n] for n in n_nodes])
        f["churn_not_seen"] = c["not_seen"]
        f["churn_sent"] = c["sent"]
        if servers:
            f["srv_churn_kb"] = med_max([c["bytes_min"][s] / 1000 for s in servers])
            f["srv_churn_cpu"] = med_max([c["cpu_ms_min"][s] for s in servers])
            f["srv_churn_rss"] = med_max([c["rss_mib"][s] for s in servers])
    return f


ROWS = [
    ("change seen by every node (ms)", "prop", "", 2),
    ("change seen by the first other node (ms)", "prop_first", "", 2),
    ("change answered to its writer (ms)", "prop_ack", "", 2),
    ("idle while forming (the first window after the start): bytes sent per node (kB/min)", "form_idle_kb", "", 1),
    ("idle while forming: packets sent per node (/min)", "form_idle_pkts", "", 0),
    ("idle: bytes sent per node (kB/min)", "idle_kb", "", 1),
    ("idle: packets sent per node (/min)", "idle_pkts", "", 0),
    ("idle: CPU per node (ms/min)", "idle_cpu", "", 0),
    ("idle: resident memory per node (MiB)", "idle_rss", "", 1),
    ("restart: bytes the node sends in 30 s (kB)", "restart_kb", "", 1),
    ("restart: connections opened to or by it in 30 s", "restart_conns", "", 0),
    ("restart: other nodes that showed it gone", "restart_gone", "", 0),
    ("restart: its return seen by every other node (ms)", "restart_back", "", 0),
    ("death (SIGKILL, stays down): gone from every other node (s)", "death_gone", "", 1),
    ("silent link (packets dropped, no FIN or RST): gone from every other node (s)", "silent_gone", "", 1),
    ("silent link: back on every other node once the link returns (s)", "silent_back", "", 1),
    ("churn: changes answered per second (asked: the rate)", "churn_rate", "", 0),
    ("churn: bytes sent per node (kB/min)", "churn_kb", "", 1),
    ("churn: lag until every node shows a change (ms)", "churn_lag", "", 1),
    ("churn: bytes received per node per change (the owners' requests included)", "churn_rx_b", "", 0),
    ("churn: packets received per node per change (the owners' requests included)", "churn_rx_pkts", "", 1),
    ("churn: CPU per node (ms/min)", "churn_cpu", "", 0),
    ("churn: resident memory per node after (MiB)", "churn_rss", "", 1),
    ("idle after the churn, registrations kept: bytes sent per node (kB/min)", "idle_after_kb", "", 1),
    ("idle after the churn, registrations kept: packets sent per node (/min)", "idle_after_pkts", "", 0),
    ("idle after the churn, registrations kept: CPU per node (ms/min)", "idle_after_cpu", "", 0),
    ("etcd servers, idle: bytes sent (kB/min)", "srv_idle_kb", "", 1),
    ("etcd servers, idle: packets sent (/min)", "srv_idle_pkts", "", 0),
    ("etcd servers, idle: CPU (ms/min)", "srv_idle_cpu", "", 0),
    ("etcd servers, idle: resident memory (MiB)", "srv_idle_rss", "", 1),
    ("etcd servers, churn: bytes sent (kB/min)", "srv_churn_kb", "", 1),
    ("etcd servers, churn: CPU (ms/min)", "srv_churn_cpu", "", 0),
    ("etcd servers, churn: resident memory (MiB)", "srv_churn_rss", "", 1),
    ("etcd servers, idle after the churn: bytes sent (kB/min)", "srv_idle_after_kb", "", 1),
    ("etcd servers, idle after the churn: packets sent (/min)", "srv_idle_after_pkts", "", 0),
]


def silence_how(results):
    hows = sorted({x["how"] for r in results for x in r.get("silent", [])})
    return "; ".join(hows) or "nft drop rules in its namespace"


def report(results, args, started, cmdline):
    out = []
    p = out.append
    p(f"# bench/compare: roster, Serf and etcd side by side\n")
    p(f"Command: `{cmdline}`  ")
    p(f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
      f"{(time.time() - started) / 60:.1f} minutes; machine: {machine()}  ")
    p(f"Versions: {versions(args)}  ")
    p(f"Settings: {args.trials} propagation trials; idle while forming: {args.form_idle:g} s right after "
      f"them; idle: {window_how(args)} (scaled to a minute); "
      f"{args.restarts} SIGKILL restarts per cluster ({args.restart_delay} s down, {args.restart_window} s "
      f"counted); death: {args.death_trials} SIGKILLed node(s) per cluster, each restarted once every "
      f"other node showed it gone (waiting at most {args.gone_timeout:g} s); silent link: "
      f"{args.silent_trials} per cluster ({silence_how(results)}), given back once every other node "
      f"showed it gone; churn: {args.preload} registrations then {args.rate} changes/s for {args.churn} s. "
      f"Cells are median / max (over trials, nodes or changes); ratios compare medians (peer / roster).\n")
    by = {(r["system"], r["n"]): r for r in results}
    for n in args.nodes:
        fr, fs, fe = (figures(by.get((s, n), {"failed": "not run"})) for s in ("roster", "serf", "etcd"))
        p(f"\n## {n} nodes\n")
        p("| figure | roster | Serf | etcd | Serf / roster | etcd / roster |")
        p("|---|---|---|---|---|---|")
        for (label, key, unit, digits) in ROWS:
            if key not in fr and key not in fs and key not in fe:
                continue
            cells = [fmt_mm(f.get(key), unit, digits) for f in (fr, fs, fe)]
            rr = fr.get(key)
            def central(x):
                return x[0] if isinstance(x, tuple) else x
            ratios = [ratio(central(f.get(key)), central(rr)) for f in (fs, fe)]
            p(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        notes = []
        for name, f in (("roster", fr), ("Serf", fs), ("etcd", fe)):
            r = by.get((name.lower(), n))
            if r is None:
                continue
            if "failed" in r:
                notes.append(f"{name}: FAILED: {r['failed']}")
                continue
            if f.get("prop_lost"):
                notes.append(f"{name}: {f['prop_lost']} of {args.trials} changes not seen by every node within 5 s")
            if "restart_gone" in f:
                gone = f["restart_gone"]
                miss = f["restart_back_missing"]
                notes.append(f"{name}: restart: after SIGKILL, shown gone on {gone} of {n - 1} other nodes"
                             + (f"; in {miss} restart(s) no event marked its return on some node "
                                "(Serf logs none for a member it never marked failed)"
                                if miss else ""))
            if "death_gone" in f:
                notes.extend(gone_notes(name, "death", f, "death", n, args))
                if f["death_back_missing"]:
                    notes.append(f"{name}: death: restarted, it was not shown back on every other node "
                                 f"within {args.gone_timeout:g} s in {f['death_back_missing']} trial(s) "
                                 f"(at least {f['death_shown_back']} of {n - 1} did)")
            if "silent_gone" in f:
                notes.extend(gone_notes(name, "silent link", f, "silent", n, args))
                if f["silent_back_missing"]:
                    notes.append(f"{name}: silent link: not shown back on every other node within "
                                 f"{args.gone_timeout:g} s of the link's return in {f['silent_back_missing']} "
                                 f"trial(s) (at least {f['silent_shown_back']} of {n - 1} did)")
                if name == "roster":
                    notes.append(f"{name}: silent link: its registration shown again on "
                                 f"{f['silent_reg_back']} of {n - 1} other nodes by the time its "
                                 "membership was")
            if r.get("snapshot_peers") is not None:
                notes.append(f"{name}: the snapshot file of a SIGKILLed agent named "
                             f"{', '.join(str(x) for x in r['snapshot_peers'])} of its {n - 1} peers "
                             "(it rejoined through -join)")
            if f.get("churn_sent"):
                c = r["churn"]
                unanswered = c["sent"] - c["acked"]
                notes.append(f"{name}: churn: of {c['sent']} changes asked, {unanswered} got no answer "
                             f"within the run, and {c['not_seen'] - unanswered} answered ones were not "
                             "seen by every node"
                             + (" (Serf's tags call waits for its broadcast, so one connection per node "
                                "makes a few changes per second; a node shows only the latest tags it "
                                "heard, and its log names the node, not the value: its lag is the time to "
                                "the first update of that node after the change, a lower bound)"
                                if name == "Serf" else ""))
            if r.get("churn", {}).get("preload_s") is not None:
                notes.append(f"{name}: preload of {args.preload} registrations on every node in "
                             f"{r['churn']['preload_s']:.1f} s")
        if notes:
            p("")
            for x in notes:
                p(f"- {x}")
    return "\n".join(out) + "\n"


def gone_notes(name, what, f, key, n, args):
    """What a gone figure covers: a node that was not shown gone everywhere, and where the
    registration went at another time than the membership."""
    out = []
    if f[f"{key}_missing"]:
        out.append(f"{name}: {what}: in {f[f'{key}_missing']} trial(s) not shown gone everywhere within "
                   f"{args.gone_timeout:g} s (at least {f[f'{key}_shown']} of {n - 1} other nodes did)")
    mem, reg = f[f"{key}_membership"], f[f"{key}_registration"]
    # (etcd's key and registration go with one lease: the same time, not worth a line)
    if mem and reg and abs(mem[0] - reg[0]) >= 0.1:
        out.append(f"{name}: {what}: its membership gone from every other node after {fmt_mm(mem)} s, "
                   f"its registration after {fmt_mm(reg)} s")
    return out


def machine():
    cpus = os.cpu_count()
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip() + ", "
                    break
    except OSError:
        pass
    return f"{model}{cpus} cores{mem}, Linux {os.uname().release}"


def versions(args):
    def first(*cmd):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (r.stdout or r.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"
    return (f"{first(args.roster_bin, '--version')}; Serf {first('dpkg-query', '-W', '-f', '${Version}', 'serf')}; "
            f"etcd {first('dpkg-query', '-W', '-f', '${Version}', 'etcd-server')}")


# ---- main --------------------------------------------------------------------------------

def clear_leftovers():
    if os.path.exists(STATE_FILE):
        with open(STATE_FILE) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2:
                    continue
                pid, work = parts
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        cmdline = c.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmdline = ""
                if work in cmdline or "cmp-" in cmdline:
                    log(f"killing leftover process {pid} of an earlier run")
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                if re.fullmatch(r"/tmp/bench-compare\.\w+\.\w+", work):
                    shutil.rmtree(work, ignore_errors=True)
        os.remove(STATE_FILE)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "driver-serf":
        return driver_serf(sys.argv[2])
    if len(sys.argv) >= 2 and sys.argv[1] == "driver-etcd":
        return driver_etcd(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(prog="bench/compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="3,10", help=f"cluster sizes (default 3,10; at most {MAX_NODES})")
    ap.add_argument("--systems", default="roster,serf,etcd")
    ap.add_argument("--trials", type=int, default=12, help="propagation trials (default 12)")
    ap.add_argument("--idle", default="auto",
                    help="steady idle window in seconds (default auto: one renewal period of "
                         "roster's member lease at that size, at least 20 s)")
    ap.add_argument("--warmup", default="auto",
                    help="seconds from the cluster's start before the steady idle window opens "
                         "(default auto: after every node's first lease renewal)")
    ap.add_argument("--form-idle", type=float, default=20,
                    help="idle window right after the propagation trials, while the cluster "
                         "forms (default 20 s)")
    ap.add_argument("--restarts", type=int, default=1, help="SIGKILL restarts per cluster (default 1)")
    ap.add_argument("--restart-window", type=float, default=30, help="seconds counted after a restart")
    ap.add_argument("--restart-delay", type=float, default=1, help="seconds a killed node stays down")
    ap.add_argument("--death-trials", type=int, default=1,
                    help="SIGKILLed nodes per cluster, each timed until every other node shows it gone, "
                         "then restarted (default 1; 0: none)")
    ap.add_argument("--silent-trials", type=int, default=1,
                    help="nodes per cluster whose link is silenced (packets dropped, no FIN or RST), each "
                         "timed until every other node shows it gone, then given back (default 1; 0: none)")
    ap.add_argument("--gone-timeout", type=float, default=90,
                    help="seconds to wait for a node to be shown gone everywhere, or back (default 90)")
    ap.add_argument("--preload", type=int, default=1000, help="registrations before the churn")
    ap.add_argument("--rate", type=float, default=100, help="changes per second in the churn")
    ap.add_argument("--churn", type=float, default=60, help="seconds of churn (0: none)")
    ap.add_argument("--settle", type=float, default=1, help="seconds between phases")
    ap.add_argument("--zones", type=int, default=1,
                    help="roster only: put node nN in zone zone-(N %% ZONES) (default 1: no zones)")
    ap.add_argument("--quick", action="store_true", help="a fast check: 3 nodes, short windows")
    ap.add_argument("--keep", action="store_true", help="keep the logs and data directories")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    args = ap.parse_args()
    args.roster_bin = os.environ.get("ROSTER_BIN", "roster")
    args.roster_driver = os.environ.get("ROSTER_DRIVER", "bench_driver")
    if args.quick:
        args.nodes, args.trials, args.idle, args.restarts = "3", 5, "10", 1
        args.warmup, args.form_idle = "0", 5
        args.restart_window, args.churn, args.preload = 10, 5, 100
    for name in ("idle", "warmup"):
        v = getattr(args, name)
        try:
            if v != "auto" and float(v) < 0:
                raise ValueError
        except ValueError:
            die(f"--{name} takes seconds (a number of at least 0) or auto, not {v!r}")
    try:
        args.nodes = [int(x) for x in args.nodes.split(",")]
    except ValueError:
        die("--nodes takes sizes like 3,10")
    if any(n < 2 or n > MAX_NODES for n in args.nodes):
        die(f"--nodes: each size must be 2 to {MAX_NODES} (one namespace and address per node)")
    systems = {"roster": Roster, "serf": Serf, "etcd": Etcd}
    chosen = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in chosen:
        if s not in systems:
            die(f"--systems: unknown system {s!r}; choose among roster, serf, etcd")
    if os.geteuid() != 0:
        die("run as root: it creates network namespaces and veth pairs")
    cmdline = "bench/compare " + " ".join(sys.argv[1:])
    started = time.time()

    clear_leftovers()
    names = ["s0", "s1", "s2"] + [f"n{i}" for i in range(max(args.nodes))]
    net = Net(names)

    def on_signal(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    results = []
    try:
        log(f"network: bridge {BRIDGE}, namespaces {', '.join(NS_PREFIX + x for x in names)}")
        net.up()
        for n in args.nodes:
            for s in chosen:
                results.append(run_system(systems[s], n, args, net))
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"compare: error: {e}", file=sys.stderr, flush=True)
        results.append({"system": "setup", "n": 0, "failed": str(e)})
    finally:
        Proc.stop_all()
        net.clear()
        if os.path.exists(STATE_FILE):
            os.remove(STATE_FILE)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    sys.stdout.write(report(results, args, started, cmdline))
    return 0 if results and not any("failed" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
