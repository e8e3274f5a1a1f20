"""The nemesis: runs the faults of schedule.py on the cluster at their times, printing each
step (`soak: t=12.3s fault: ...`, `soak: t=20.1s heal: ...`), and heals everything at a
quiet period. It keeps what is wrong now (for the reach probes: which links are cut, which
nodes are clean) and what was wrong when (for the log check: which faults explain an ERROR
line)."""
import signal
import threading

from schedule import describe

INF = float("inf")


class State:
    """What the nemesis has done that is not healed yet."""

    def __init__(self, names):
        self.names = list(names)
        self.down = set()  # not running (killed, terminated, being restored)
        self.stopped = set()  # SIGSTOPped
        self.clock = {n: "+0" for n in names}
        # clock stepped since the node's last start (kept for the story of a failure; a
        # node whose clock came back must recover without a restart, and the clock probes,
        # reach.py, time it: the reach probes need only its clock true now and no fault on
        # it within their calm window)
        self.clock_since_start = set()
        self.disk = {}  # node -> "full" | "eio"
        self.lossy = set()
        self.cut = set()  # directed (dialer, target)
        self.partition = None  # its description
        self.partition_record = None  # its entry in Nemesis.history
        self.epoch = {n: 0 for n in names}  # bumped at every change that touches a node

    def clean(self, nodes):
        """Nodes running as they should: up, not stopped, true clock, a working disk, no
        lossy links."""
        return all(n not in self.down and n not in self.stopped and self.clock[n] == "+0"
                   and n not in self.disk and n not in self.lossy for n in nodes)


class Nemesis:
    def __init__(self, soak):
        self.soak = soak
        self.c = soak.cluster
        self.model = soak.model
        self.lock = threading.Lock()
        self.state = State(self.c.net.names)
        # [kind, nodes (None: all), start, end, description] (soak clock; end INF while on)
        self.history = []
        self.copies = {}  # node -> the model's snapshot of its copied data dir
        self.counts = {}

    def say(self, what, msg):
        self.soak.say(f"t={self.soak.now():.1f}s {what}: {msg}")

    def touch(self, *nodes):
        for n in nodes:
            self.state.epoch[n] += 1

    # ---- a window --------------------------------------------------------------------------
    def steps(self, f):
        """[(seconds into the window, action)] of fault f."""
        at, span, k = f["at"], f["span"], f["kind"]
        if k == "restore":
            return [(at, lambda: self.copy(f)), (at + f["gap"], lambda: self.restore(f)),
                    (at + span, lambda: self.restart(f))]
        return [(at, lambda: self.begin(f)), (at + span, lambda: self.end(f))]

    def run_window(self, faults, length):
        t0 = self.soak.now()
        steps = sorted((s for f in faults for s in self.steps(f)), key=lambda s: s[0])
        for at, action in steps:
            self.soak.sleep_until(t0 + at)
            action()
        self.soak.sleep_until(t0 + length)

    def record(self, f, nodes):
        with self.lock:
            self.history.append([f["kind"], nodes, self.soak.now(), INF, describe(f)])
            f["_record"] = self.history[-1]
        self.counts[f["kind"]] = self.counts.get(f["kind"], 0) + 1

    def close(self, f):
        with self.lock:
            rec = f.pop("_record", None)
            if rec is not None:
                rec[3] = self.soak.now()

    # ---- faults ----------------------------------------------------------------------------
    def begin(self, f):
        k, n, st = f["kind"], f.get("node"), self.state
        self.record(f, {n} if n else None)
        self.say("fault", describe(f))
        with self.lock:
            if k in ("kill", "term"):
                st.down.add(n)
            elif k == "stop":
                st.stopped.add(n)
            elif k == "clock":
                st.clock[n] = f["offset"]
                st.clock_since_start.add(n)
            elif k in ("full", "eio"):
                st.disk[n] = k
            elif k == "lossy":
                st.lossy = set(f["nodes"])
            else:
                st.cut, st.partition = {tuple(p) for p in f["cut"]}, f["desc"]
                st.partition_record = f["_record"]
            self.touch(*([n] if n else st.names))
        if k == "kill":
            self.c.kill_agent(n)
        elif k == "term":
            self.c.terminate(n)
        elif k == "stop":
            self.c.signal(n, signal.SIGSTOP)
        elif k == "clock":
            self.c.set_clock(n, f["offset"])
        elif k == "full":
            self.c.fill_disk(n)
        elif k == "eio":
            self.c.set_eio(n, True)
        elif k == "lossy":
            self.c.set_links(lossy=f["nodes"])
        else:
            self.c.set_links(cut=f["cut"])

    def end(self, f):
        k, n = f["kind"], f.get("node")
        if k in ("kill", "term"):
            return self.restart(f)
        if k == "stop":
            self.c.signal(n, signal.SIGCONT)
            msg = f"SIGCONT {n}"
        elif k == "clock":
            self.c.set_clock(n, "+0")
            msg = f"{n}'s clock back to the true time (+0), no restart"
        elif k == "full":
            self.c.free_disk(n)
            msg = f"{n}'s disk freed"
        elif k == "eio":
            self.c.set_eio(n, False)
            msg = f"{n}'s disk works again"
        elif k == "lossy":
            self.c.set_links(lossy=[])
            msg = "no loss or delay"
        else:
            self.c.set_links(cut=[])
            msg = f"partition healed ({f['desc']})"
        with self.lock:
            st = self.state
            st.stopped.discard(n)
            st.disk.pop(n, None)
            if k == "clock":
                st.clock[n] = "+0"
            if k == "lossy":
                st.lossy = set()
            if k in ("silent", "ring", "oneway"):
                st.cut, st.partition, st.partition_record = set(), None, None
            self.touch(*([n] if n else st.names))
        rec = f.get("_record")
        self.close(f)
        self.say("heal", msg)
        if k == "clock":  # time a new write of n until its peers show it (reach.py)
            self.soak.clock_prober.request(n, f["offset"], rec)

    def copy(self, f):
        n = f["node"]
        self.record(f, {n})
        self.model.block(n)
        try:
            self.copies[n] = self.model.snapshot(n)
            self.c.take_copy(n)
        finally:
            self.model.unblock(n)
        self.say("fault", f"copied {n}'s data dir (SIGSTOP, copy, SIGCONT); restored in {f['gap']} s")

    def restore(self, f):
        n = f["node"]
        self.model.block(n)
        with self.lock:
            self.state.down.add(n)
            self.touch(n)
        self.c.kill_agent(n)
        self.c.restore_copy(n)
        self.model.restore(n, self.copies.pop(n))
        self.say("fault", f"SIGKILL {n}, its data dir restored from the copy; restart in "
                          f"{round(f['span'] - f['gap'], 1)} s")

    def restart(self, f):
        n = f["node"]
        self.c.start_agent(n)
        self.model.unblock(n)
        with self.lock:
            self.state.down.discard(n)
            if self.state.clock[n] == "+0":
                self.state.clock_since_start.discard(n)
            self.touch(n)
        self.close(f)
        self.say("heal", f"{n} restarted on its data dir (clock {self.c.clock(n)})")

    # ---- a quiet period --------------------------------------------------------------------
    def heal_all(self):
        """Undo every fault still on: links, signals, clocks, disks, then restart whatever is
        down. A node whose clock was stepped keeps its taint (State.clock_since_start) unless
        it restarts here: the check that follows is what judges it."""
        st = self.state
        self.c.set_links(cut=[], lossy=[])
        for n in sorted(st.stopped):
            self.c.signal(n, signal.SIGCONT)
        for n in st.names:
            self.c.set_eio(n, False)
            self.c.free_disk(n)
            self.c.set_clock(n, "+0")
        restarted = sorted(st.down)
        for n in restarted:
            self.c.start_agent(n)
            self.model.unblock(n)
        with self.lock:
            st.down, st.stopped, st.disk, st.lossy = set(), set(), {}, set()
            st.cut, st.partition, st.partition_record = set(), None, None
            st.clock = {n: "+0" for n in st.names}
            st.clock_since_start -= set(restarted)
            self.touch(*st.names)
            now = self.soak.now()
            for rec in self.history:
                rec[3] = min(rec[3], now)
        self.copies.clear()
        self.say("heal", "everything (quiet period)" +
                 (f"; restarted {','.join(restarted)}" if restarted else ""))

    def calm(self, nodes, since, but):
        """Whether no fault but `but` (a history entry) touched `nodes` from `since` on."""
        with self.lock:
            return not any(rec is not but and rec[3] >= since and (rec[1] is None or rec[1] & nodes)
                           for rec in self.history)

    def active(self, t0, t1):
        """The faults on at some time in [t0, t1]: [(kind, nodes)]."""
        with self.lock:
            return [(k, nodes) for k, nodes, s, e, _ in self.history if s <= t1 and e >= t0]

    def story(self, nodes, since):
        """For a failure message: the faults that touched `nodes` since `since`, with times."""
        with self.lock:
            recs = [r for r in self.history if r[3] >= since and r[1] is not None and r[1] & nodes]
        return "; ".join(f"t={s:.1f}-{e:.1f}s {d}" for _, _, s, e, d in recs) or "none"
