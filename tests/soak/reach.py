"""Reach probes: during a silent partition or a ring, a registration acknowledged on a node
must reach every node it still has a path to (its side, through the links not cut) within
REACH_LIMIT seconds. Probes run only on a calm side: every node of it up, with a true clock
(not stepped since its start), a working disk and no lossy links, and no fault but the
partition on any of them since CALM_BEFORE seconds before the partition began (a node that
just restarted, or links that just healed, are still dialing: that is not what this
measures; a quiet period that converged counts as calm). A fault that touches the side during a probe voids it. The origin is preferably a
node with no direct link to another node of its side (the writes then go around)."""
import json
import random
import threading
import time

from clients import write

CALM_BEFORE = 5.0


def components(names, cut):
    """The sides: sets of nodes linked (directly or not) by links not cut either way."""
    linked = {n: {m for m in names if m != n and (n, m) not in cut and (m, n) not in cut}
              for n in names}
    seen, out = set(), []
    for n in names:
        if n in seen:
            continue
        side, todo = set(), [n]
        while todo:
            x = todo.pop()
            if x not in side:
                side.add(x)
                todo += linked[x] - side
        seen |= side
        out.append(side)
    return out, linked


class Prober(threading.Thread):
    def __init__(self, soak, limit):
        super().__init__(daemon=True, name="prober")
        self.soak, self.limit = soak, limit
        self.rng = random.Random(f"{soak.seed}-prober")
        self.on = threading.Event()
        self.busy = threading.Lock()
        self.times = []  # seconds for a probe to reach its whole side
        self.voided = 0

    def run(self):
        while not self.soak.stopping:
            time.sleep(0.5)
            if not self.on.is_set():
                continue
            with self.busy:
                plan = self.plan()
                if plan is not None:
                    self.probe(*plan)

    def pause(self):
        self.on.clear()
        with self.busy:
            pass

    def plan(self):
        """(origin, targets, epochs, partition) for a probe now, or None."""
        nem = self.soak.nemesis
        with nem.lock:
            st = nem.state
            rec = st.partition_record
            if rec is None or rec[0] not in ("silent", "ring"):
                return None
            sides, linked = components(st.names, st.cut)
            sides = [s for s in sides if len(s) >= 2 and st.clean(s)]
            epochs = dict(st.epoch)
            desc = st.partition
        since = max(rec[2] - CALM_BEFORE, self.soak.last_check_end)  # a check is a calm point
        sides = [s for s in sides if nem.calm(s, since, rec)]
        if not sides:
            return None
        side = self.rng.choice(sorted(sides, key=sorted))
        around = sorted(n for n in side if side - linked[n] - {n})
        origin = self.rng.choice(around or sorted(side))
        return origin, sorted(side - {origin}), epochs, (desc, linked)

    def peers(self, nodes):
        """Whom each node is connected to (`roster status --json`), for a failure message."""
        out = []
        for n in nodes:
            r = self.soak.cluster.cli(n, "status", "--json", timeout=5)
            try:
                names = sorted(p["name"] for p in json.loads(r.stdout)["peers"])
            except (AttributeError, ValueError, KeyError, TypeError):
                names = ["?"]
            out.append(f"{n}: {','.join(names) or 'none'}")
        return "; ".join(out)

    def probe(self, origin, targets, epochs, partition):
        desc, linked = partition
        soak, nem = self.soak, self.soak.nemesis
        inst = soak.model.new(origin, "r")
        if inst is None:
            return
        inst.pinned = True
        try:
            via = self.rng.choice(["cli", "http"])
            if not write(soak, via, inst, True):
                return
            t0 = time.monotonic()
            left = set(targets)
            while left:
                for n in sorted(left):
                    if soak.api.has(n, inst.iid, timeout=2) is True:
                        left.discard(n)
                with nem.lock:
                    touched = any(nem.state.epoch[n] != epochs[n] for n in [origin] + targets)
                if touched:
                    self.voided += 1
                    soak.note(f"reach probe {inst.iid} from {origin} voided (a fault touched the side)")
                    return
                if left and time.monotonic() - t0 > self.limit:
                    far = ", ".join(f"{n} ({'link not cut' if n in linked[origin] else 'link cut: only through others'})"
                                    for n in sorted(left))
                    soak.checker.diagnose(f"reach probe {inst.iid} from {origin} failed")
                    soak.violate(f"during the {desc}: a registration acknowledged by {origin} "
                                 f"({inst.iid}, through {via}) had not reached {far} on its side "
                                 f"{self.limit:.0f} s later (the side is calm: no other fault); "
                                 f"connected peers then: {self.peers([origin] + sorted(left))}")
                    return
                time.sleep(0.2)
            took = time.monotonic() - t0
            if took > self.limit:  # the last poll found it, past the limit
                soak.violate(f"during the {desc}: a registration acknowledged by {origin} "
                             f"({inst.iid}, through {via}) took {took:.1f} s to reach "
                             f"{','.join(targets)}, over the {self.limit:.0f} s limit (the side is calm)")
            self.times.append(took)
            soak.note(f"reach probe {inst.iid} from {origin} to {','.join(targets)} during the "
                      f"{desc}: {took:.2f} s")
        finally:
            inst.pinned = False


class ClockProber(threading.Thread):
    """Clock probes: when a clock fault ends (the node's wall clock back to the true time,
    no restart), a fresh registration is written on that node and timed until every running
    peer it has a path to shows it. Calm: the node and those peers up and running, with no
    fault on them but this clock fault (no disk fault, no lossy link, no other clock off)
    and none since CALM_BEFORE seconds before the clock came back; a fault that touches them
    during the probe voids it. A calm probe slower than `limit` is a violation (its figure,
    the median and max, is printed at the end, by the offset the clock had)."""

    def __init__(self, soak, limit):
        super().__init__(daemon=True, name="clock-prober")
        self.soak, self.limit = soak, limit
        self.rng = random.Random(f"{soak.seed}-clock-prober")
        self.on = threading.Event()
        self.on.set()
        self.busy = threading.Lock()
        self.cv = threading.Condition()
        self.todo = []  # (node, offset, the fault's history entry, soak time it ended)
        self.times = {}  # offset -> [seconds]
        self.voided = {}  # offset -> count

    def request(self, node, offset, rec):
        with self.cv:
            self.todo.append((node, offset, rec, self.soak.now()))
            self.cv.notify_all()

    def pause(self):
        """No new probe; the one in flight ends (voided: the quiet period heals everything)."""
        self.on.clear()
        with self.busy:
            pass
        with self.cv:
            for node, offset, _, _ in self.todo:
                self.void(offset, f"{node}: a quiet period began first")
            self.todo = []

    def void(self, offset, why):
        self.voided[offset] = self.voided.get(offset, 0) + 1
        self.soak.note(f"clock probe ({offset}) voided: {why}")

    def run(self):
        while not self.soak.stopping:
            with self.cv:
                if not self.todo:
                    self.cv.wait(0.2)
                    continue
            with self.busy:
                with self.cv:
                    if not self.todo:
                        continue
                    node, offset, rec, ended = self.todo.pop(0)
                if not self.on.is_set():
                    self.void(offset, f"{node}: the writers were paused")
                    continue
                self.probe(node, offset, rec, ended)

    def plan(self, node, rec, ended):
        """(targets, epochs) for a calm probe of `node`, or (None, why not)."""
        nem = self.soak.nemesis
        with nem.lock:
            st = nem.state
            if node in st.down or node in st.stopped:
                return None, "it is not running"
            sides, _ = components(st.names, st.cut)
            side = next(s for s in sides if node in s)
            targets = sorted(m for m in side - {node} if m not in st.down and m not in st.stopped)
            everyone = [node] + targets
            dirty = [m for m in everyone
                     if m in st.disk or m in st.lossy or st.clock[m] != "+0"]
            epochs = dict(st.epoch)
        if not targets:
            return None, "no running peer on its side"
        if dirty:
            return None, f"another fault on {','.join(dirty)}"
        since = max(ended - CALM_BEFORE, self.soak.last_check_end)
        if not nem.calm(set(everyone), since, rec):
            return None, f"another fault touched {','.join(everyone)} within {CALM_BEFORE:.0f} s"
        return (targets, epochs), None

    def probe(self, node, offset, rec, ended):
        soak, nem = self.soak, self.soak.nemesis
        plan, why = self.plan(node, rec, ended)
        if plan is None:
            return self.void(offset, f"{node}: {why}")
        targets, epochs = plan
        inst = soak.model.new(node, "k")
        if inst is None:
            return self.void(offset, f"{node}: held by the nemesis")
        inst.pinned = True
        try:
            via = self.rng.choice(["cli", "http"])
            t0 = soak.t0 + ended  # the clock came back: the figure is timed from here
            t_write = time.monotonic()
            if not write(soak, via, inst, True):
                return self.void(offset, f"{node} did not acknowledge the probe {inst.iid}")
            t_ack = time.monotonic()
            left = set(targets)
            while left:
                for n in sorted(left):
                    if soak.api.has(n, inst.iid, timeout=2) is True:
                        left.discard(n)
                with nem.lock:
                    touched = [n for n in [node] + targets if nem.state.epoch[n] != epochs[n]]
                if touched:
                    return self.void(offset, f"{inst.iid} from {node}: a fault touched "
                                             f"{','.join(touched)} during the probe")
                if left and time.monotonic() - t0 > self.limit:
                    soak.checker.diagnose(f"clock probe {inst.iid} on {node} failed")
                    soak.violate(f"{node}'s clock came back from {offset} (no restart): a "
                                 f"registration it acknowledged ({inst.iid}, through {via}) "
                                 f"had not reached {','.join(sorted(left))} {self.limit:.0f} s "
                                 f"later (no other fault on them); connected peers then: "
                                 f"{Prober.peers(self, [node] + sorted(left))}")
                    return
                time.sleep(0.1)
            took = time.monotonic() - t0
            if took > self.limit:  # the last poll found it, past the limit
                soak.violate(f"{node}'s clock came back from {offset} (no restart): a registration "
                             f"it acknowledged ({inst.iid}, through {via}) took {took:.1f} s to reach "
                             f"{','.join(targets)}, over the {self.limit:.0f} s limit (no other fault on them)")
            self.times.setdefault(offset, []).append(took)
            soak.note(f"clock probe {inst.iid} on {node} (clock back from {offset}; written "
                      f"{t_write - t0:.2f} s after, acknowledged in {t_ack - t_write:.2f} s) "
                      f"shown by {','.join(targets)} {took:.2f} s after the clock came back")
        finally:
            inst.pinned = False
