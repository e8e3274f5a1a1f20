#!/usr/bin/env python3
"""The Jepsen-style run of tests/jepsen/run (see tests/jepsen/README.md). Root only.

Five agents a..e, each in its own network namespace on a bridge, speaking mutual TLS (a CA
made with openssl; each certificate names its node, `roster id`), every link between two
agents through a user-space forwarder (proxy.py) that delays, stalls, resets and silently
cuts. A writer registers and deregisters instances of the service `jep` on every live agent
throughout and records what was acknowledged; the checks compare every agent's
`roster get jep --json` with that record. Any violation: one line `jepsen: FAIL: ...` on
stderr and exit 1.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROSTER = os.environ["ROSTER_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))


class Net:
    """Where a run's agents live: for each name a namespace `<prefix>-<name>`, joined to the
    bridge by a veth `<prefix>v-<name>`, an address `<subnet>.<11 + i>` and a port
    `<port> + i`. This run's is NET; tests/jepsen/zones.py makes one of its own (other
    prefix, bridge, subnet and ports), so neither run's leftovers touch the other's."""

    def __init__(self, names, prefix, bridge, subnet, port):
        self.names = list(names)
        self.prefix = prefix
        self.ns = {n: f"{prefix}-{n}" for n in self.names}
        self.veth = {n: f"{prefix}v-{n}" for n in self.names}
        self.bridge = bridge
        self.subnet = subnet
        self.ip = {n: f"{subnet}.{11 + i}" for i, n in enumerate(self.names)}
        self.port = {n: port + i for i, n in enumerate(self.names)}


NAMES = ["a", "b", "c", "d", "e"]
NET = Net(NAMES, prefix="jep", bridge="jepbr", subnet="10.79.0", port=7600)
NS = NET.ns
BRIDGE = NET.bridge
IP = NET.ip
PORT = NET.port
LEASE = 4.0  # --lease-ttl, seconds
GOSSIP = "250ms"
GRACE = 3.0  # allowed beyond the lease for a dead node's instances to be gone everywhere
# Seconds a convergence may take before it is a failure. Two take 12-18 s on main today,
# both waiting on dial backoff, not on replication: after the heal (the dials across the cut
# failed for 12 s, so their backoff grew) and after the clock fix (the node's saved backoff,
# grown while every peer refused its clock, keeps it from dialing; its peers dial it when
# theirs ends). The output shows them; the limit leaves room above.
CONVERGE_LIMIT = 30.0
SIDE_LIMIT = 10.0  # seconds for a write to reach its side of the cut
SEED = int(os.environ.get("ROSTER_SEED", str(random.randrange(1 << 30))))
rng = random.Random(SEED)
T0 = time.monotonic()
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
LOG_NAME = "jepsen"  # the prefix of log lines (zones.py sets its own)


def log(msg):
    print(f"[{LOG_NAME} {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class Fail(Exception):
    pass


def fail(msg):
    raise Fail(msg)


def sh(*args, check=True):
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


# ---- network ------------------------------------------------------------------------------
def net_down(net=NET):
    for n in net.names:
        ns = net.ns[n]
        if os.path.exists(f"/run/netns/{ns}"):
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", net.veth[n], check=False)
    sh("ip", "link", "del", net.bridge, check=False)


def net_up(net=NET):
    sh("ip", "link", "add", net.bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{net.subnet}.1/24", "dev", net.bridge)
    sh("ip", "link", "set", net.bridge, "up")
    for n in net.names:
        ns = net.ns[n]
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", net.veth[n], "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", net.veth[n], "master", net.bridge, "up")
        sh("ip", "-n", ns, "addr", "add", f"{net.ip[n]}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


# ---- processes ----------------------------------------------------------------------------
procs = {}  # key -> Popen


def spawn(key, ns, args, env=None, logf=None):
    out = open(logf, "ab") if logf else subprocess.DEVNULL
    p = subprocess.Popen(["ip", "netns", "exec", ns] + args, stdout=out, stderr=out,
                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    procs[key] = p  # `ip netns exec` execs the command: this pid is the program's
    return p


def stop(key, sig=signal.SIGTERM):
    p = procs.pop(key, None)
    if p is None:
        return
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        pass
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def stop_all():
    for key in list(procs):
        stop(key, signal.SIGKILL)


# ---- certificates (openssl) ---------------------------------------------------------------
def make_ca(d):
    """A CA for the run, in directory d: its certificate's path."""
    os.makedirs(d, mode=0o700)
    ca, key = os.path.join(d, "ca.pem"), os.path.join(d, "ca.key")
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", key, "-out", ca, "-days", "2", "-subj", "/CN=roster jepsen CA",
       "-addext", "basicConstraints=critical,CA:TRUE",
       "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return ca


def issue(d, name, sans):
    """A certificate and key for `name`, signed by the CA in d, carrying the names `sans`."""
    csr, ext = os.path.join(d, f"{name}.csr"), os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={','.join(sans)}\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n")
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", os.path.join(d, f"{name}.key"), "-out", csr, "-subj", f"/CN={name}")
    sh("openssl", "x509", "-req", "-in", csr, "-CA", os.path.join(d, "ca.pem"),
       "-CAkey", os.path.join(d, "ca.key"), "-CAcreateserial", "-days", "2",
       "-out", os.path.join(d, f"{name}.pem"), "-extfile", ext)


# ---- the cluster --------------------------------------------------------------------------
class Cluster:
    """The agents of `net` (NET by default), their forwarders and certificates. `agent_args(n)`
    gives agent n's flags beyond the common ones (none by default), `joins(n)` the names it
    `--join`s (every other agent by default)."""

    def __init__(self, work, net=NET, agent_args=None, joins=None):
        self.work = work
        self.net = net
        self.agent_args = agent_args or (lambda n: [])
        self.joins = joins or (lambda n: [m for m in net.names if m != n])
        self.control = os.path.join(work, "control.json")
        self.secret = os.path.join(work, "secret")
        with open(self.secret, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        os.chmod(self.secret, 0o600)
        self.tls = os.path.join(work, "tls")
        self.ca = make_ca(self.tls)
        self.alive = set()
        self.cut = []
        self.lossy = False
        self.write_control()

    def write_control(self):
        tmp = self.control + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"cut": self.cut, "lossy": self.lossy}, f)
        os.replace(tmp, self.control)

    def set_faults(self, cut=None, lossy=None):
        if cut is not None:
            self.cut = [list(p) for p in cut]
        if lossy is not None:
            self.lossy = lossy
        self.write_control()

    def start_proxies(self):
        net = self.net
        for n in net.names:
            targets = [f"{m}={net.ip[m]}:{net.port[m]}" for m in net.names if m != n]
            spawn(f"proxy-{n}", net.ns[n], [sys.executable, os.path.join(HERE, "proxy.py"), n,
                                             self.control] + targets,
                  logf=os.path.join(self.work, f"proxy-{n}.log"))
        deadline = time.monotonic() + 10
        for n in net.names:
            while b"ready" not in open(os.path.join(self.work, f"proxy-{n}.log"), "rb").read():
                if time.monotonic() > deadline:
                    fail(f"the proxy in {net.ns[n]} did not start")
                time.sleep(0.05)

    def start_agent(self, n, clock_ahead=None):
        data = os.path.join(self.work, f"data-{n}")
        cert, key = self.certificate(n, data)
        port = self.net.port
        args = [ROSTER, "agent", "--listen", f"0.0.0.0:{port[n]}",
                "--advertise", f"wss://127.0.0.1:{port[n]}",
                "--data-dir", data,
                "--cluster-secret-file", self.secret, "--node-name", n,
                "--gossip-interval", GOSSIP, "--lease-ttl", f"{int(LEASE)}s",
                # the lease as asked: by default it grows 24 s per member (192 s here), and
                # a node that nobody on a side of a partition had a link to, so nobody
                # could write dead, stayed listed there that long
                "--lease-per-member", "0s",
                "--crash-guard", "off",
                "--tls-cert", cert, "--tls-key", key, "--tls-ca", self.ca]
        args += self.agent_args(n)
        for m in self.joins(n):
            args += ["--join", f"wss://127.0.0.1:{port[m]}"]
        env = dict(os.environ)
        env.setdefault("ROSTER_LOG", "info")
        if clock_ahead:
            # libfaketime moves the wall clock only (as an NTP step or a bad RTC would):
            # the agent's timers run on the monotonic clock
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=clock_ahead,
                       FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_NO_CACHE="1")
        logf = os.path.join(self.work, f"agent-{n}.log")
        with open(logf, "ab") as f:
            f.write(f"---- start{' clock ' + clock_ahead if clock_ahead else ''}\n".encode())
        spawn(f"agent-{n}", self.net.ns[n], args, env=env, logf=logf)
        deadline = time.monotonic() + 10
        while True:
            r = self.cli(n, "status", timeout=2)
            if r is not None and r.returncode == 0:
                break
            if time.monotonic() > deadline:
                fail(f"agent {n} did not answer `roster status` within 10 s of its start")
            time.sleep(0.1)
        self.alive.add(n)

    def certificate(self, n, data):
        """Agent n's certificate and key, issued once: it names `node-<id>`, the id that
        `roster id` makes in its data directory before the first start, and 127.0.0.1, the
        host every agent dials (its proxy's end in the namespace)."""
        cert, key = os.path.join(self.tls, f"{n}.pem"), os.path.join(self.tls, f"{n}.key")
        if not os.path.exists(cert):
            node = sh(ROSTER, "id", "--data-dir", data).stdout.strip()
            issue(self.tls, n, [f"DNS:node-{node}", "IP:127.0.0.1"])
        return cert, key

    def kill_agent(self, n):
        self.alive.discard(n)
        stop(f"agent-{n}", signal.SIGKILL)

    def cli(self, n, *args, timeout=6):
        try:
            return subprocess.run(["ip", "netns", "exec", self.net.ns[n], ROSTER, *args,
                                   "--agent", f"wss://127.0.0.1:{self.net.port[n]}",
                                   "--tls-ca", self.ca],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def view(self, n):
        """The instance ids agent n shows live, or None when it does not answer."""
        r = self.cli(n, "get", "jep", "--json", timeout=5)
        if r is None:
            return None
        if r.returncode == 1 and not r.stdout.strip():
            return set()
        if r.returncode != 0:
            return None
        return {i["instance"] for i in json.loads(r.stdout)}

    def views(self, nodes):
        out = {}
        ts = [threading.Thread(target=lambda m=m: out.__setitem__(m, self.view(m))) for m in nodes]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out


# ---- the writer ---------------------------------------------------------------------------
class Writer:
    """Registers and deregisters instances of `jep` on the live agents, recording every
    acknowledged operation. An operation that was not acknowledged (an error, a timeout, a
    kill mid-way) leaves its instance uncertain: it may or may not exist, and no check
    relies on it."""

    def __init__(self, cluster):
        self.c = cluster
        self.lock = threading.Lock()
        self.owner = {}  # id -> node it was registered through
        self.live = set()  # acknowledged registered, not (attempted) deregistered
        self.gone = {}  # id -> monotonic time its deregistration was acknowledged
        self.uncertain = set()
        self.probes = set()  # registered by `reach`: the loop never deregisters them
        self.seq = 0
        self.ops = {"register": 0, "deregister": 0, "failed": 0}
        self.on = threading.Event()
        self.busy = threading.Lock()  # held through each of the loop's operations
        self.nodes = set(cluster.net.names)
        self.stopped = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def register(self, n, probe=False):
        with self.lock:
            self.seq += 1
            iid = f"w{self.seq}-{n}"
            self.owner[iid] = n
            self.uncertain.add(iid)
            if probe:
                self.probes.add(iid)
        r = self.c.cli(n, "register", "jep", f"10.0.{self.seq // 250}.{self.seq % 250}:80",
                       "--id", iid)
        with self.lock:
            if r is not None and r.returncode == 0:
                self.uncertain.discard(iid)
                self.live.add(iid)
                self.ops["register"] += 1
            else:
                self.ops["failed"] += 1
        return iid, r is not None and r.returncode == 0

    def deregister(self, iid):
        n = self.owner[iid]
        with self.lock:
            self.live.discard(iid)
            self.uncertain.add(iid)
        r = self.c.cli(n, "deregister", "jep", iid)
        with self.lock:
            if r is not None and r.returncode == 0:
                self.uncertain.discard(iid)
                self.gone[iid] = time.monotonic()
                self.ops["deregister"] += 1
            else:
                self.ops["failed"] += 1
        return r is not None and r.returncode == 0

    def loop(self):
        while not self.stopped:
            if not self.on.wait(0.2):
                continue
            nodes = sorted(self.nodes & self.c.alive)
            if not nodes:
                time.sleep(0.1)
                continue
            n = rng.choice(nodes)
            with self.busy:
                with self.lock:
                    mine = sorted(i for i in self.live - self.probes if self.owner[i] == n)
                if mine and rng.random() < 0.35:
                    self.deregister(rng.choice(mine))
                else:
                    self.register(n)
            time.sleep(rng.uniform(0.02, 0.1))

    def pause(self):
        self.on.clear()
        with self.busy:  # an operation in flight ends first
            pass

    def resume(self, nodes=None):
        self.nodes = set(nodes) if nodes else set(self.c.net.names)
        self.on.set()


# ---- checks -------------------------------------------------------------------------------
def judge(w, views, owners_alive, dead=()):
    """None when every view is right, else the first problem."""
    with w.lock:
        want = {i for i in w.live if w.owner[i] in owners_alive}
        gone = set(w.gone)
        unc = set(w.uncertain)
        dead_ids = {i for i, o in w.owner.items() if o in dead}
        known = set(w.owner)
    for n, v in sorted(views.items()):
        if v is None:
            return f"{n} does not answer"
        back = v & gone
        if back:
            return f"{n} shows {len(back)} deregistered instance(s) again, e.g. {sorted(back)[0]}"
        missing = want - v
        if missing:
            return (f"{n} lacks {len(missing)} acknowledged registration(s) of live owners, "
                    f"e.g. {sorted(missing)[0]} (owner {w.owner[sorted(missing)[0]]})")
        extra = v - want - unc
        extra_dead = v & dead_ids
        if extra_dead:
            return f"{n} still shows {len(extra_dead)} instance(s) of dead node(s), e.g. {sorted(extra_dead)[0]}"
        if extra - known:
            return f"{n} shows instance(s) nobody registered: {sorted(extra - known)[:3]}"
        stray = {i for i in extra if w.owner.get(i) not in owners_alive}
        if stray:
            return f"{n} shows {len(stray)} instance(s) whose owner is not on its side or not alive, e.g. {sorted(stray)[0]}"
    return None


def converge(c, w, nodes, owners_alive, what, limit=CONVERGE_LIMIT, dead=()):
    """Poll until every node in `nodes` shows exactly what the writer's record says; return
    the seconds it took."""
    t = time.monotonic()
    problem = None
    while time.monotonic() - t < limit:
        problem = judge(w, c.views(nodes), owners_alive, dead)
        if problem is None:
            took = time.monotonic() - t
            log(f"converged: {what}: {took:.1f} s")
            return took
        time.sleep(0.2)
    fail(f"{what}: not converged within {limit:.0f} s: {problem}")


def reach(c, w, origin, nodes, limit, what):
    """One write on `origin`; seconds until every node in `nodes` shows it. The writer's loop
    never deregisters it (it did, now and then, while this waited: a failure of the test)."""
    iid, ok = w.register(origin, probe=True)
    if not ok:
        fail(f"{what}: agent {origin} did not acknowledge a registration")
    t = time.monotonic()
    while time.monotonic() - t < limit:
        vs = c.views(nodes)
        if all(v is not None and iid in v for v in vs.values()):
            return time.monotonic() - t
        time.sleep(0.1)
    vs = c.views(nodes)
    lacking = ",".join(n for n in nodes if vs[n] is not None and iid not in vs[n])
    silent = ",".join(n for n in nodes if vs[n] is None)
    for n in [origin] + list(nodes):  # for the logs kept in the work dir
        r = c.cli(n, "status", timeout=5)
        with open(os.path.join(c.work, f"status-{n}.txt"), "a") as f:
            f.write(r.stdout if r is not None else "no answer\n")
    fail(f"{what}: a registration on {origin} ({iid}) did not reach {','.join(nodes)} "
         f"within {limit:.0f} s (lacking it: {lacking or '-'}; not answering: {silent or '-'})")


# ---- the run ------------------------------------------------------------------------------
def run(work):
    results = []

    def result(k, v):
        results.append((k, v))

    log(f"seed {SEED} (ROSTER_SEED={SEED} replays the writer's choices), work dir {work}")
    net_up()
    c = Cluster(work)
    c.start_proxies()
    for n in NAMES:
        c.start_agent(n)
    w = Writer(c)

    # 0. a clean start
    for n in NAMES:
        for _ in range(3):
            w.register(n)
    result("start: 5 agents converged", converge(c, w, NAMES, set(NAMES), "start"))

    # 1. 20% loss and 50+-30 ms delay on every link for 30 s, writing all along
    log("faults: 20% loss (stalls, resets) and 50+-30 ms delay on every link, 30 s of writes")
    c.set_faults(lossy=True)
    w.resume()
    time.sleep(30)
    w.pause()
    log(f"writer so far: {w.ops}")
    result("after 30 s of loss and delay, writes stopped: lossy links", converge(
        c, w, NAMES, set(NAMES), "under loss and delay, after the writes stopped"))
    c.set_faults(lossy=False)

    # 2. a silent partition {a,b,c} | {d,e}, longer than the lease; a and b have no direct link
    left, right = ["a", "b", "c"], ["d", "e"]
    cut = [(x, y) for x in left for y in right] + [("a", "b")]
    log(f"faults: silent partition {{a,b,c}} | {{d,e}} for {3 * LEASE:.0f} s "
        f"(the lease is {LEASE:.0f} s); a-b cut too, so a and b hear each other only through c")
    c.set_faults(cut=cut)
    t_cut = time.monotonic()
    w.resume()
    # within the cut: a write on a reaches b (through c), one on b reaches a, d's reaches e
    probes = []
    while time.monotonic() - t_cut < 3 * LEASE:
        for origin, nodes in (("a", ["b", "c"]), ("b", ["a", "c"]), ("d", ["e"]), ("e", ["d"])):
            probes.append(reach(c, w, origin, nodes, SIDE_LIMIT,
                                f"during the partition ({time.monotonic() - t_cut:.0f} s in)"))
        time.sleep(0.5)
    w.pause()
    result(f"partition: a write reaches its side ({len(probes)} probes, median / max)",
           (sorted(probes)[len(probes) // 2], max(probes)))
    # each side shows exactly its own side's registrations, the other side's having expired
    result("partition, writes stopped: side {a,b,c}",
           converge(c, w, left, set(left), "side {a,b,c} while cut", limit=LEASE + SIDE_LIMIT))
    result("partition, writes stopped: side {d,e}",
           converge(c, w, right, set(right), "side {d,e} while cut", limit=LEASE + SIDE_LIMIT))
    log(f"partition lasted {time.monotonic() - t_cut:.1f} s")

    # 3. heal
    c.set_faults(cut=[])
    log("faults: healed")
    result("heal: every node shows every live owner's registrations",
           converge(c, w, NAMES, set(NAMES), "after the heal"))

    # 4. SIGKILL during writes, restart on the same data dir
    w.resume()
    for victim in ("b", "d"):
        time.sleep(2)
        log(f"SIGKILL {victim} during writes")
        c.kill_agent(victim)
        time.sleep(1)
        c.start_agent(victim)
        log(f"{victim} restarted on its data dir")
    time.sleep(2)
    w.pause()
    result("SIGKILLs of b and d, restarted: converged",
           converge(c, w, NAMES, set(NAMES), "after the SIGKILLs and restarts"))

    # 5. a clock 60 s ahead on c, then fixed
    log("c restarts with its wall clock 60 s ahead (libfaketime), writes on it")
    c.kill_agent("c")
    c.start_agent("c", clock_ahead="+60s")
    w.resume(nodes=["c"])
    time.sleep(4)
    w.pause()
    w.resume()
    time.sleep(3)
    w.pause()
    log("c restarts with the true clock")
    c.kill_agent("c")
    c.start_agent("c")
    result("clock fixed on c: every node shows c's registrations (written while ahead too)",
           converge(c, w, NAMES, set(NAMES), "after c's clock was fixed"))

    # 6. a node that dies for good: its instances are gone everywhere within the lease
    w.resume()
    time.sleep(2)
    log("SIGKILL e during writes, for good")
    c.kill_agent("e")
    t_kill = time.monotonic()
    w.pause()
    others = [n for n in NAMES if n != "e"]
    with w.lock:
        e_ids = {i for i, o in w.owner.items() if o == "e"}
    while True:
        vs = c.views(others)
        if all(v is not None and not (v & e_ids) for v in vs.values()):
            gone_in = time.monotonic() - t_kill
            break
        if time.monotonic() - t_kill > LEASE + GRACE:
            left_on = sorted(n for n, v in vs.items() if v is None or v & e_ids)
            fail(f"e's instances still shown on {','.join(left_on)} "
                 f"{LEASE + GRACE:.0f} s after its SIGKILL (lease {LEASE:.0f} s)")
        time.sleep(0.1)
    log(f"e's instances gone everywhere {gone_in:.1f} s after its SIGKILL")
    result(f"dead node e: its instances gone everywhere (lease {LEASE:.0f} s)", gone_in)
    result("final: the 4 live agents", converge(c, w, others, set(others), "final",
                                                dead=("e",)))
    return results, w


def main():
    if os.geteuid() != 0:
        print("jepsen: skipped: needs root (network namespaces)", file=sys.stderr)
        return 0
    work = tempfile.mkdtemp(prefix="jepsen.")
    keep = os.environ.get("JEPSEN_KEEP") == "1"

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    net_down()  # leftovers of a run that was killed
    rc = 0
    try:
        results, w = run(work)
        print("| what | seconds |")
        print("|---|---|")
        for k, v in results:
            s = f"{v[0]:.1f} / {v[1]:.1f}" if isinstance(v, tuple) else f"{v:.1f}"
            print(f"| {k} | {s} |")
        print(f"\nwriter: {w.ops['register']} registrations and {w.ops['deregister']} "
              f"deregistrations acknowledged, {w.ops['failed']} not; seed {SEED}; "
              f"{time.monotonic() - T0:.0f} s in all")
        print("jepsen: PASS")
    except Fail as e:
        print(f"jepsen: FAIL: {e} (seed {SEED}; logs in {work})", file=sys.stderr)
        keep, rc = True, 1
    except BaseException as e:
        print(f"jepsen: ERROR: {e!r} (logs in {work})", file=sys.stderr)
        keep, rc = True, 2
    finally:
        stop_all()
        net_down()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
