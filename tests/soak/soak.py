#!/usr/bin/env python3
"""The randomized fault soak of tests/soak/run (see tests/soak/README.md). Root only.

Five agents (SOAK_AGENTS, 5 to 9) in network namespaces, every link through
tests/jepsen/proxy.py; clients write and watch through the CLI and the HTTP API while a
nemesis drawn from the seed injects overlapping faults; about every minute a quiet period
heals everything and the checker compares every agent and every watch with what the
clients were told. Any violation: one line `soak: FAIL: ...` and exit 1 (2 when the harness
itself broke).

    ROSTER_SEED=N     replay a seed (else one is drawn and printed first)
    SOAK_SECONDS=300  how long; SOAK_AGENTS=5; SOAK_KEEP=1 keeps the work dir
    SOAK_PLAN=1       print the seed's fault schedule and exit (no root needed)
    SOAK_CONTINUE=1   for diagnosis: report every violation and go on to the end
"""
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "jepsen"))
import schedule  # noqa: E402

SEED = int(os.environ.get("ROSTER_SEED") or random.randrange(1 << 30))
os.environ["ROSTER_SEED"] = str(SEED)  # jepsen.py, imported below, reads it
SECONDS = float(os.environ.get("SOAK_SECONDS", "300"))
AGENTS = int(os.environ.get("SOAK_AGENTS", "5"))
KEEP = os.environ.get("SOAK_KEEP") == "1"
CONTINUE = os.environ.get("SOAK_CONTINUE") == "1"
CONVERGE_LIMIT = float(os.environ.get("SOAK_CONVERGE_LIMIT", "30"))
CONVERGE_AIM = 15.0
REACH_LIMIT = float(os.environ.get("SOAK_REACH_LIMIT", "5"))
CLOCK_LIMIT = float(os.environ.get("SOAK_CLOCK_LIMIT", "15"))
CLOCK_AIM = 5.0
WINDOWS = max(1, int(SECONDS // 60))
LENGTH = max(20.0, SECONDS / WINDOWS - 10)  # seconds of faults a window; its check follows
NAMES = "abcdefghi"[:AGENTS]
# Runs side by side, each in a slot of its own (0-3): namespaces, bridge, subnet, ports,
# work dirs and lock apart, so that 10 seeds of 30 minutes take less than 10 half hours.
SLOT = int(os.environ.get("SOAK_SLOT") or 0)
PREFIX = "soak" if SLOT == 0 else f"soak{SLOT}"


def soak_net(names):
    """Slot `SLOT`'s network: slot 0 is the one a run always had."""
    from jepsen import Net
    return Net(names, prefix=PREFIX, bridge=f"{PREFIX}br", subnet=f"10.{81 + SLOT}.0", port=7800 + 200 * SLOT)


def say(msg):
    print(f"soak: {msg}", flush=True)


class Soak:
    """What every part of the run shares: the cluster, the model, the clients, the clock
    (`now`: seconds since the agents started) and the violations."""

    def __init__(self, work):
        from cluster import SoakCluster
        from httpapi import Api
        from model import Model
        self.seed, self.work = SEED, work
        self.stopping = False
        self.violations = []
        self.vlock = threading.Lock()
        self.rlock = threading.Lock()
        self.t0 = time.monotonic()
        self.last_check_end = 0.0
        self.since_faults = []  # each quiet period's convergence, from the last fault's end
        self.net = soak_net(NAMES)
        self.model = Model()
        self.cluster = SoakCluster(work, self.net, say)
        self.api = Api(self.cluster)

    def now(self):
        return time.monotonic() - self.t0

    def say(self, msg):
        say(msg)
        self.note(re.sub(r"^t=[0-9.]+s ", "", msg))

    def note(self, msg):
        """A line in the work dir's soak.log only (details for a diagnosis)."""
        with self.vlock:
            with open(os.path.join(self.work, "soak.log"), "a") as f:
                f.write(f"t={self.now():.1f}s {msg}\n")

    def record(self, name, line):
        """A line in the work dir's file `name` (writes.log, watch-*.events)."""
        with self.rlock:
            with open(os.path.join(self.work, name), "a") as f:
                f.write(f"t={self.now():.2f}s {line}\n")

    def violate(self, msg):
        """A violation seen by any thread: the main thread fails with the first (with
        SOAK_CONTINUE=1 each is printed and the run goes on)."""
        self.note(f"VIOLATION: {msg}")
        with self.vlock:
            self.violations.append((self.now(), msg))
            if CONTINUE:
                say(f"t={self.now():.1f}s VIOLATION (going on): {msg}")

    def fail(self, msg):
        from jepsen import Fail
        self.violate(msg)
        if not CONTINUE:
            raise Fail(self.violations[0])

    def check_violations(self):
        from jepsen import Fail
        with self.vlock:
            if self.violations and not CONTINUE:
                raise Fail(self.violations[0])

    def sleep_until(self, t):
        while True:
            self.check_violations()
            left = t - self.now()
            if left <= 0:
                return
            time.sleep(min(left, 0.2))

    def writable(self):
        """Agents the writers may write through: started and not killed (a stopped one
        answers late or never: those writes are uncertain)."""
        return set(self.cluster.alive) - self.model.blocked

    def running(self):
        st = self.nemesis.state
        return set(self.cluster.alive) - st.stopped


def start(soak):
    from checker import Checker, LogScan
    from clients import CliWatch, Sampler, SseWatch, Writer
    from jepsen import net_up
    from nemesis import Nemesis
    from reach import ClockProber, Prober
    c = soak.cluster
    net_up(soak.net)
    c.start_proxies()
    for n in NAMES:
        c.start_agent(n)
    soak.t0 = time.monotonic()
    wall = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    soak.say(f"t=0.0s (= {wall}Z, the true UTC time the agents' logs are stamped in) {len(NAMES)} agents up ({','.join(NAMES)}; namespaces {PREFIX}-*, bridge {PREFIX}br, "
        f"10.{81 + SLOT}.0.0/24, ports {7800 + 200 * SLOT}+), work dir {soak.work}")
    soak.nemesis = Nemesis(soak)
    soak.checker = Checker(soak, CONVERGE_LIMIT)
    soak.writers = [Writer(soak, "cli"), Writer(soak, "http")]
    soak.prober = Prober(soak, REACH_LIMIT)
    soak.clock_prober = ClockProber(soak, CLOCK_LIMIT)
    rng = random.Random(f"{SEED}-watches")
    nodes = rng.sample(NAMES, 4)
    soak.watches = [CliWatch(soak, nodes[0]), CliWatch(soak, nodes[1]),
                    SseWatch(soak, nodes[2]), SseWatch(soak, nodes[3])]
    soak.sampler = Sampler(soak)
    soak.logscan = LogScan(soak)
    for t in soak.writers + soak.watches + [soak.prober, soak.clock_prober, soak.sampler,
                                            soak.logscan]:
        t.start()
    say(f"watches: cli on {nodes[0]},{nodes[1]}; sse on {nodes[2]},{nodes[3]}")


def pause(soak):
    for w in soak.writers:
        w.pause()
    soak.prober.pause()
    soak.clock_prober.pause()


def resume(soak):
    for w in soak.writers:
        w.on.set()
    soak.prober.on.set()
    soak.clock_prober.on.set()


def quiet(soak, label):
    """Heal, check, print the figures."""
    pause(soak)
    soak.nemesis.heal_all()
    healed = soak.now()
    with soak.nemesis.lock:  # every fault is closed by the heal: the last one to end
        last_end = max((rec[3] for rec in soak.nemesis.history), default=healed)
    f = soak.checker.quiet(label, time.monotonic())
    soak.logscan.scan()
    soak.check_violations()
    soak.last_check_end = soak.now()
    note = f"; not acknowledged at the quiet probe: {','.join(f['unacked'])}" if f["unacked"] else ""
    if f["converge"] is None:
        say(f"t={soak.now():.1f}s {label}: NOT converged within {CONVERGE_LIMIT:.0f} s{note}")
    else:
        f["since_faults"] = f["converge"] + healed - last_end
        soak.since_faults.append((label, f["since_faults"]))
        say(f"t={soak.now():.1f}s {label}: converged {f['converge']:.1f} s after the heal, "
            f"{f['since_faults']:.1f} s after the last fault ended ({f['live']} live "
            f"instances, every agent through HTTP and CLI); watches agree "
            f"({f['watches']:.1f} s){note}")
    return f


def run(soak):
    plan = schedule.draw(SEED, WINDOWS, LENGTH, NAMES)
    with open(os.path.join(soak.work, "schedule.txt"), "w") as fh:
        fh.write(f"seed {SEED}\n{schedule.plan_text(plan, LENGTH)}\n")
    start(soak)
    quiet(soak, "start")
    for k, faults in enumerate(plan):
        say(f"t={soak.now():.1f}s window {k + 1} of {len(plan)}: {len(faults)} faults over "
            f"{LENGTH:.0f} s")
        resume(soak)
        soak.nemesis.run_window(faults, LENGTH)
        quiet(soak, f"quiet period {k + 1}" + (" (the end)" if k == len(plan) - 1 else ""))


def figures(soak):
    """Print what the run did; the convergence times, for the verdict line."""
    if not hasattr(soak, "logscan"):
        return ""
    times = [t for label, t in soak.checker.times if label != "start"]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(soak.nemesis.counts.items()))
    writes = ", ".join(f"{k} {v}" for k, v in sorted(soak.model.stats.items()))
    probes = sorted(soak.prober.times)
    reach = (f"{len(probes)} (median {probes[len(probes) // 2]:.1f} s, max {probes[-1]:.1f} s)"
             if probes else "0")
    cp = soak.clock_prober
    clock = []
    for off in sorted(set(cp.times) | set(cp.voided)):
        ts = sorted(cp.times.get(off, []))
        fig = f"median {ts[len(ts) // 2]:.1f} s, max {ts[-1]:.1f} s" if ts else "none calm"
        clock.append(f"back from {off}: {len(ts)} ({fig}), {cp.voided.get(off, 0)} voided")
    say(f"faults: {counts or 'none'}")
    say(f"writes: {writes}")
    say(f"reach probes: {reach}, {soak.prober.voided} voided; watch events: "
        f"{sum(w.events for w in soak.watches)} (restarts {sum(w.restarts for w in soak.watches)}); "
        f"reads sampled: {soak.sampler.reads}; log lines (ERROR, WARN) a fault explains: "
        f"{soak.logscan.explained}, WARN lines none explains: {soak.logscan.odd_warnings} (soak.log)")
    say(f"clock probes (a new write on a node whose clock came back, no restart, until every "
        f"running peer of its side shows it; aim within {CLOCK_AIM:.0f} s, limit "
        f"{CLOCK_LIMIT:.0f} s): {'; '.join(clock) or 'none'}")
    if not times:
        return "no quiet period converged"
    since = [t for label, t in soak.since_faults if label != "start"]
    worst = f"; from the last fault's end, worst {max(since):.1f} s" if since else ""
    return (f"{len(times)} quiet periods converged in {' / '.join(f'{t:.1f}' for t in times)} s "
            f"after the heal (worst {max(times):.1f} s{worst}; aim under {CONVERGE_AIM:.0f} s, "
            f"limit {CONVERGE_LIMIT:.0f} s); {soak.now():.0f} s in all")


def cleanup(soak, net, keep):
    from cluster import unmount_leftovers
    from jepsen import net_down, stop_all
    if soak is not None:
        soak.stopping = True
    stop_all()
    if soak is not None:
        soak.cluster.unmount_disks(keep)
    net_down(net)
    unmount_leftovers(PREFIX)


def main():
    say(f"seed {SEED} (ROSTER_SEED={SEED} replays it)")
    if os.environ.get("SOAK_PLAN") == "1":
        print(schedule.plan_text(schedule.draw(SEED, WINDOWS, LENGTH, NAMES), LENGTH))
        return 0
    if os.geteuid() != 0:
        say("SKIPPED: needs root (network namespaces, tmpfs mounts)")
        return 0
    if not 5 <= AGENTS <= 9:
        say("error: SOAK_AGENTS must be 5 to 9")
        return 2
    if not 0 <= SLOT <= 3:
        say("error: SOAK_SLOT must be 0 to 3")
        return 2
    from cluster import unmount_leftovers
    from jepsen import Fail, net_down
    net = soak_net(NAMES)
    net_down(soak_net("abcdefghi"))
    unmount_leftovers(PREFIX)  # what a run of this slot killed with SIGKILL left

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    work = tempfile.mkdtemp(prefix=f"{PREFIX}.")
    keep, rc, soak = KEEP, 0, None
    try:
        soak = Soak(work)
        run(soak)
        if soak.violations:
            raise Fail(soak.violations[0])
        say(f"PASS seed {SEED}: {figures(soak)}")
    except Fail as e:
        t, msg = e.args[0] if isinstance(e.args[0], tuple) else (soak.now() if soak else 0, e.args[0])
        if soak is not None:
            soak.stopping = True
            fig = figures(soak)
            if fig:
                say(f"before the failure: {fig}")
            if len(soak.violations) > 1:
                say(f"{len(soak.violations)} violations in all (soak.log lists them); the first:")
        say(f"FAIL: {msg} (seed {SEED}, t={t:.1f}s; logs in {work})")
        keep, rc = True, 1
    except SystemExit as e:  # SIGINT, SIGTERM
        say(f"stopped by signal {e.code - 128} (seed {SEED}; logs in {work})")
        keep, rc = True, e.code
    except BaseException as e:  # noqa: BLE001 - the harness broke
        say(f"ERROR: {e!r} (seed {SEED}; logs in {work})")
        keep, rc = True, 2
    finally:
        cleanup(soak, net, keep)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
