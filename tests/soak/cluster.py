"""The soak's agents: tests/jepsen/jepsen.py's Cluster (namespaces, forwarders, mutual TLS),
with what the nemesis needs on top (see tests/soak/README.md):

- every forwarder (tests/jepsen/proxy.py, unchanged) reads a control file of its own, so a
  link can be cut in one direction of dialing only (X cannot dial Y, Y dials X) and loss is
  per dialer;
- every agent runs under libfaketime reading its clock offset from a file of its own
  (FAKETIME_TIMESTAMP_FILE, not cached), so its wall clock steps without a restart;
- every agent's data directory is a small tmpfs of its own (a full disk: a ballast file),
  and an LD_PRELOAD shim (eio.c) fails its writes and syncs with EIO while a flag file
  exists (a disk that returns errors);
- the HTTP API listens on the namespace's bridge address, over HTTPS, for clients that
  show a certificate of the run's CA (clients.py);
- signals (SIGSTOP, SIGCONT, SIGTERM) and copies of a data directory (taken while the agent
  is stopped, so they are what a crash would leave), restored into it.
"""
import contextlib
import json
import os
import shutil
import signal
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "jepsen"))
import jepsen  # noqa: E402
from jepsen import fail, procs, sh, spawn, stop  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.path.join(HERE, "..", "jepsen", "proxy.py")
FAKETIME_LIB = jepsen.FAKETIME_LIB
DISK_SIZE = "16m"  # each agent's data directory: a tmpfs this large
HTTP_OFFSET = 50  # agent i's HTTP API listens on port + 50


@contextlib.contextmanager
def faked_clock(offset):
    """Programs started inside run with their wall clock moved by `offset` (libfaketime):
    the CA and the certificates are made a day in the past, valid for two days, so a clock
    stepped an hour or two either way still trusts them (a year ahead does not: see the
    README)."""
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "FAKETIME")}
    os.environ.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=offset)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_shim(work):
    """Compile eio.c into the work dir; its path."""
    out = os.path.join(work, "eio.so")
    sh("cc", "-shared", "-fPIC", "-O2", "-o", out, os.path.join(HERE, "eio.c"), "-ldl")
    return out


def unmount_leftovers(prefix):
    """Unmount the data-dir tmpfs of any earlier run of this slot (work dirs
    /tmp/<prefix>.*)."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for p in points:
        if os.path.basename(os.path.dirname(p)).startswith(f"{prefix}.") and "/data-" in p:
            sh("umount", "-l", p, check=False)


class SoakCluster(jepsen.Cluster):
    def __init__(self, work, net, log):
        self.log = log
        self.links = {"cut": set(), "lossy": set()}  # cut: directed (dialer, target) pairs
        self.http_port = {n: p + HTTP_OFFSET for n, p in net.port.items()}
        self.shim = build_shim(work)
        with faked_clock("-1d"):
            super().__init__(work, net=net)
        self.client_cert = self.issue_client()
        for n in net.names:
            self.mount_disk(n)
            self.set_clock(n, "+0")

    # ---- links ---------------------------------------------------------------------------
    def control_of(self, n):
        return os.path.join(self.work, f"control-{n}.json")

    def write_control(self):
        if not hasattr(self, "links"):  # jepsen.Cluster.__init__ calls this first
            return
        for n in self.net.names:
            cut = [[a, b] for a, b in sorted(self.links["cut"]) if a == n]
            tmp = self.control_of(n) + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"cut": cut, "lossy": n in self.links["lossy"]}, f)
            os.replace(tmp, self.control_of(n))

    def set_links(self, cut=None, lossy=None):
        """cut: directed pairs (x, y): x's dials to y (and the connections x dialed to y) are
        silently cut; lossy: the nodes whose dialed connections are lossy."""
        if cut is not None:
            self.links["cut"] = {tuple(p) for p in cut}
        if lossy is not None:
            self.links["lossy"] = set(lossy)
        self.write_control()

    def start_proxies(self):
        net = self.net
        self.write_control()
        for n in net.names:
            targets = [f"{m}={net.ip[m]}:{net.port[m]}" for m in net.names if m != n]
            spawn(f"proxy-{n}", net.ns[n], [sys.executable, PROXY, n, self.control_of(n)] + targets,
                  logf=os.path.join(self.work, f"proxy-{n}.log"))
        deadline = time.monotonic() + 10
        for n in net.names:
            while b"ready" not in open(os.path.join(self.work, f"proxy-{n}.log"), "rb").read():
                if time.monotonic() > deadline:
                    fail(f"the proxy in {net.ns[n]} did not start")
                time.sleep(0.05)

    # ---- certificates --------------------------------------------------------------------
    def certificate(self, n, data):
        sh(jepsen.ROSTER, "id", "--data-dir", data)  # the identity, made at the true time
        with faked_clock("-1d"):
            return super().certificate(n, data)

    def issue_client(self):
        """A client certificate of the run's CA, for the HTTP clients (not on loopback)."""
        with faked_clock("-1d"):
            jepsen.issue(self.tls, "soak-client", ["DNS:soak-client"])
        return os.path.join(self.tls, "soak-client.pem"), os.path.join(self.tls, "soak-client.key")

    # ---- agents --------------------------------------------------------------------------
    def data(self, n):
        return os.path.join(self.work, f"data-{n}")

    def agent_env(self, n):
        env = dict(os.environ)
        env.setdefault("ROSTER_LOG", "info")
        env.update(LD_PRELOAD=f"{FAKETIME_LIB} {self.shim}",
                   FAKETIME_TIMESTAMP_FILE=self.clock_file(n), FAKETIME_NO_CACHE="1",
                   FAKETIME_DONT_FAKE_MONOTONIC="1",
                   SOAK_EIO_DIR=self.data(n), SOAK_EIO_FLAG=self.eio_flag(n))
        return env

    def start_agent(self, n, clock_ahead=None):
        """Start agent n on its data dir with jepsen's flags, and wait for it to answer."""
        data = self.data(n)
        cert, key = self.certificate(n, data)
        port = self.net.port
        args = [jepsen.ROSTER, "agent", "--listen", f"0.0.0.0:{port[n]}",
                "--advertise", f"wss://127.0.0.1:{port[n]}", "--data-dir", data,
                "--http-listen", f"0.0.0.0:{self.http_port[n]}",
                "--cluster-secret-file", self.secret, "--node-name", n,
                "--gossip-interval", jepsen.GOSSIP, "--lease-ttl", f"{int(jepsen.LEASE)}s",
                "--lease-per-member", "0s", "--crash-guard", "off",
                "--tls-cert", cert, "--tls-key", key, "--tls-ca", self.ca]
        for m in self.joins(n):
            args += ["--join", f"wss://127.0.0.1:{port[m]}"]
        logf = os.path.join(self.work, f"agent-{n}.log")
        with open(logf, "ab") as f:
            f.write(f"---- soak: start (clock {self.clock(n)})\n".encode())
        p = spawn(f"agent-{n}", self.net.ns[n], args, env=self.agent_env(n), logf=logf)
        deadline = time.monotonic() + 15
        while True:
            r = self.cli(n, "status", timeout=3)
            if r is not None and r.returncode == 0:
                break
            if p.poll() is not None:
                fail(f"agent {n} exited ({p.returncode}) at its start: {self.log_tail(n)}")
            if time.monotonic() > deadline:
                fail(f"agent {n} did not answer `roster status` within 15 s of its start")
            time.sleep(0.1)
        self.alive.add(n)

    def log_tail(self, n, lines=3):
        with open(os.path.join(self.work, f"agent-{n}.log"), "rb") as f:
            tail = f.read()[-4000:].decode(errors="replace").strip().splitlines()
        return " | ".join(tail[-lines:])

    def pid(self, n):
        p = procs.get(f"agent-{n}")
        return p.pid if p is not None else None

    def signal(self, n, sig):
        pid = self.pid(n)
        if pid is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self, n):
        """SIGTERM, and wait for the graceful stop (SIGKILL after 5 s)."""
        self.alive.discard(n)
        stop(f"agent-{n}", signal.SIGTERM)

    # ---- clocks --------------------------------------------------------------------------
    def clock_file(self, n):
        return os.path.join(self.work, f"clock-{n}")

    def set_clock(self, n, offset):
        tmp = self.clock_file(n) + ".tmp"
        with open(tmp, "w") as f:
            f.write(offset + "\n")
        os.replace(tmp, self.clock_file(n))

    def clock(self, n):
        with open(self.clock_file(n)) as f:
            return f.read().strip()

    # ---- disks ---------------------------------------------------------------------------
    def mount_disk(self, n):
        os.makedirs(self.data(n), exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700", f"{self.net.prefix}-{n}", self.data(n))

    def unmount_disks(self, keep):
        for n in self.net.names:
            d = self.data(n)
            if not os.path.ismount(d):
                continue
            if keep:  # the tmpfs goes with the mount: keep a copy beside it
                shutil.copytree(d, d + ".kept", symlinks=True, dirs_exist_ok=True)
            sh("umount", "-l", d, check=False)

    def ballast(self, n):
        return os.path.join(self.data(n), "soak-ballast")

    def fill_disk(self, n):
        """Fill agent n's tmpfs with a ballast file until writes fail with ENOSPC."""
        st = os.statvfs(self.data(n))
        fd = os.open(self.ballast(n), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * 4096):
                    pass
        finally:
            os.close(fd)

    def free_disk(self, n):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ballast(n))

    def eio_flag(self, n):
        return os.path.join(self.work, f"eio-{n}")

    def set_eio(self, n, on):
        if on:
            open(self.eio_flag(n), "w").close()
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.eio_flag(n))

    # ---- copies of a data directory ------------------------------------------------------
    def snapshot_path(self, n):
        return os.path.join(self.work, f"copy-{n}")

    def take_copy(self, n):
        """Copy agent n's data dir while every thread of the agent is stopped (SIGSTOP): what
        a crash at that moment would leave on disk."""
        dst = self.snapshot_path(n)
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        self.signal(n, signal.SIGSTOP)
        try:
            self.wait_stopped(n)
            sh("cp", "-a", self.data(n) + "/.", dst + "/")
        finally:
            self.signal(n, signal.SIGCONT)

    def wait_stopped(self, n, limit=2.0):
        """Wait until every thread of agent n is stopped (a thread in a system call stops
        when it returns)."""
        task = f"/proc/{self.pid(n)}/task"
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            states = []
            for t in os.listdir(task):
                with contextlib.suppress(OSError):
                    with open(os.path.join(task, t, "stat")) as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
            if states and all(s in "tT" for s in states):
                return
            time.sleep(0.005)
        fail(f"agent {n} did not stop within {limit:.0f} s of SIGSTOP")

    def restore_copy(self, n):
        """Put the copy back as agent n's data dir (the agent must be down)."""
        d = self.data(n)
        for name in os.listdir(d):
            p = os.path.join(d, name)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        sh("cp", "-a", self.snapshot_path(n) + "/.", d + "/")
