"""The soak's checks (see tests/soak/README.md):

- at each quiet period (every fault healed, the writers paused): a fresh registration on
  every agent, then every agent must show exactly what the model allows, the same on every
  agent, within CONVERGE_LIMIT seconds (the time it took is printed), through the HTTP API
  and then through the CLI; then every watch's fold must equal what its agent shows;
- all along: no panic in any agent's log, and no ERROR line that no fault on at the time
  explains (ALLOWED_ERRORS).
"""
import os
import re
import threading
import time

from clients import cli_view, write
from model import ABSENT

WATCH_LIMIT = 15.0  # seconds after the convergence for every watch to show its agent's state
LOG_GRACE = 30.0  # a fault explains log lines up to this long after it healed

# What each fault may make an agent log at ERROR or WARN (regexes, from the lines these runs
# logged). roster logs nothing at ERROR today: an ERROR line that no fault on at the time
# explains fails the run; a WARN line that none explains is counted and listed in soak.log
# (a note: warnings are how roster reports what it survived). Every fault may explain lines
# on every agent (a peer sees it), but a disk fault only on its own agent.
NET = [r"closed the connection: nothing arrived for", r"no authenticated peer within",
       r"connection failed", r"TLS handshake failed: .*(reset|closed|eof)",
       r"no peer reached \d+s after the start"]
CLOCK = [r"clock is \d+ ms ahead", r"clock runs \d+ ms ahead",
         r"TLS handshake failed: .*certificate (expired|not valid yet)"]
DISK = [r"cannot be written", r"could not save", r"could not deregister", r"could not write a status"]
ALLOWED = {
    "kill": NET, "term": NET, "stop": NET, "restore": NET,
    "clock": NET + CLOCK, "full": DISK, "eio": DISK,
    "lossy": NET, "silent": NET, "ring": NET, "oneway": NET,
}
DISK_KINDS = ("full", "eio")


class Checker:
    def __init__(self, soak, limit):
        self.soak, self.limit = soak, limit
        self.c, self.model = soak.cluster, soak.model
        self.times = []  # (label, seconds to converge)

    # ---- views ---------------------------------------------------------------------------
    def views(self, nodes, via="http"):
        out = {}

        def one(n):
            out[n] = self.soak.api.view(n) if via == "http" else cli_view(self.soak, n)

        ts = [threading.Thread(target=one, args=(n,)) for n in nodes]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    def judge(self, views):
        """(None, iid -> the state every agent shows) when every view is right and they
        agree, else (what is wrong, by agent, None)."""
        m = self.model
        exp = m.expected()
        agreed, problems = {}, []
        for n, v in sorted(views.items()):
            if v is None:
                problems.append(f"{n} does not answer")
                continue
            unknown = sorted(set(v) - set(exp))
            if unknown:
                problems.append(f"{n} shows instance(s) nobody registered: {unknown[:3]}")
            wrong = []
            for iid, (owner, allowed) in sorted(exp.items()):
                s = m.state_of(iid, v.get(iid))
                if s not in allowed:
                    wrong.append((iid, owner, s, allowed))
                elif agreed.setdefault(iid, (n, s))[1] != s:
                    a, sa = agreed[iid]
                    problems.append(f"{a} and {n} disagree on {iid} (owner {owner}): "
                                    f"{m.describe(sa)} / {m.describe(s)}")
            if wrong:
                problems.append(self.wrong(n, wrong))
        if problems:
            return "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else ""), None
        return None, {iid: s for iid, (_, s) in agreed.items()}

    def owners_of(self, problem):
        """The owners a problem names (for the story of their faults)."""
        return set(re.findall(r"\(owner ([a-i])", problem)) | set(re.findall(r"owners: ([a-i]) ", problem))

    def wrong(self, n, wrong):
        m = self.model
        lacks = [w for w in wrong if w[2] is ABSENT]
        extra = [w for w in wrong if w[2] is not ABSENT]
        parts = []
        if lacks:
            iid, owner, _, allowed = lacks[0]
            parts.append(f"{n} lacks {len(lacks)} acknowledged registration(s), e.g. {iid} "
                         f"(owner {owner}, {m.describe(max(allowed, key=lambda s: s or 0))} "
                         f"acknowledged; owners: {owners(lacks)})")
        if extra:
            iid, owner, s, allowed = extra[0]
            want = " or ".join(m.describe(a) for a in sorted(allowed, key=lambda s: s or 0))
            parts.append(f"{n} shows {len(extra)} instance(s) in a state never acknowledged, "
                         f"e.g. {iid} (owner {owner}) as {m.describe(s)} where {want} was "
                         f"acknowledged; owners: {owners(extra)}")
        return "; ".join(parts)

    # ---- a quiet period ------------------------------------------------------------------
    def quiet_probes(self):
        """A fresh registration on every agent (CLI and HTTP in turn): each must reach every
        other agent (an agent whose writes peers refuse is found here)."""
        notes = []
        for i, n in enumerate(self.c.net.names):
            inst = self.model.new(n, "q")
            if inst is None or not write(self.soak, "cli" if i % 2 else "http", inst, True):
                notes.append(n)
        return notes

    def converge(self, label, t0):
        """Seconds from t0 (the heal: every agent running again) until every agent shows
        what the model allows, through HTTP then CLI."""
        nodes = self.c.net.names
        problem = None
        while time.monotonic() - t0 < self.limit:
            problem, shown = self.judge(self.views(nodes, "http"))
            if problem is None:
                took = time.monotonic() - t0
                problem, shown = self.judge(self.views(nodes, "cli"))
                if problem is None:
                    self.model.settle(shown)
                    self.times.append((label, took))
                    return took, len([s for s in shown.values() if s is not ABSENT])
                problem = f"through the CLI (the HTTP API agreed): {problem}"
            time.sleep(0.25)
        self.diagnose(label)
        story = self.soak.nemesis.story(self.owners_of(problem), self.soak.last_check_end)
        self.soak.fail(f"{label}: not converged {self.limit:.0f} s after the heal: "
                       f"{problem} [faults on those owners since the last check: {story}]")
        return None, 0  # SOAK_CONTINUE=1: go on

    def diagnose(self, label):
        """`roster status` and `roster members` (each lease's end, as this agent sees it)
        of every agent into the work dir, for the logs kept."""
        for n in self.c.net.names:
            r = self.c.cli(n, "status", timeout=5)
            j = self.c.cli(n, "status", "--json", timeout=5)  # with the counters
            m = self.c.cli(n, "members", "--json", timeout=5)
            with open(os.path.join(self.c.work, f"status-{n}.txt"), "a") as f:
                f.write(f"---- t={self.soak.now():.1f}s {label}\n"
                        + "\n".join(x.stdout if x is not None else "no answer" for x in (r, j, m))
                        + "\n")
            metrics = self.soak.api.text(n, "/metrics")
            with open(os.path.join(self.c.work, f"metrics-{n}.txt"), "a") as f:
                f.write(f"---- t={self.soak.now():.1f}s {label}\n{metrics or 'no answer'}\n")

    def watches(self, label):
        """Every watch's fold equals what its agent shows now (the cluster converged)."""
        t0 = time.monotonic()
        for w in self.soak.watches:
            while True:
                want = self.soak.api.view(w.node)
                got = w.folded()
                if want is not None and got == want:
                    break
                if time.monotonic() - t0 > WATCH_LIMIT:
                    self.soak.fail(f"{label}: the {w.kind} watch on {w.node} does not show what "
                                   f"{w.node} shows {WATCH_LIMIT:.0f} s after it converged: "
                                   f"{diff(got, want)}")
                    break
                time.sleep(0.25)
        return time.monotonic() - t0

    def quiet(self, label, healed):
        """The check of a quiet period (`healed`: when every fault was undone): its figures."""
        unacked = self.quiet_probes()
        took, live = self.converge(label, healed)
        wt = self.watches(label)
        return {"converge": took, "live": live, "unacked": unacked, "watches": wt}


def owners(ws):
    counts = {}
    for w in ws:
        counts[w[1]] = counts.get(w[1], 0) + 1
    return ", ".join(f"{o} {k}" for o, k in sorted(counts.items()))


def diff(got, want):
    if want is None:
        return "the agent does not answer"
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(i for i in set(got) & set(want) if got[i] != want[i])
    parts = []
    if missing:
        parts.append(f"{len(missing)} missed, e.g. {missing[0]} (the agent shows {want[missing[0]][1]})")
    if extra:
        parts.append(f"{len(extra)} not shown by the agent, e.g. {extra[0]} ({got[extra[0]][1]})")
    if changed:
        i = changed[0]
        parts.append(f"{len(changed)} with another value, e.g. {i}: watch {got[i][1]}, agent {want[i][1]}")
    return "; ".join(parts)


class LogScan(threading.Thread):
    """Reads the agents' logs as they grow (every 2 s): a panic fails; an ERROR line fails
    unless a fault on at the time (or healed within LOG_GRACE) allows its pattern; a WARN
    line that no fault allows is noted."""

    def __init__(self, soak):
        super().__init__(daemon=True, name="logscan")
        self.soak = soak
        self.pos = {n: 0 for n in soak.cluster.net.names}
        self.last = soak.now()
        self.explained = 0
        self.odd_warnings = 0
        self.lock = threading.Lock()

    def run(self):
        while not self.soak.stopping:
            time.sleep(2)
            self.scan()

    def scan(self):
        with self.lock:
            t0, t1 = self.last, self.soak.now()
            self.last = t1
            for n in self.pos:
                for line in self.new_lines(n):
                    self.judge(n, line, t0, t1)

    def new_lines(self, n):
        path = os.path.join(self.soak.cluster.work, f"agent-{n}.log")
        try:
            with open(path, "rb") as f:
                f.seek(self.pos[n])
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.pos[n] += end
        return data[:end].decode(errors="replace").splitlines()

    def explains(self, n, line, t0, t1):
        faults = self.soak.nemesis.active(t0 - LOG_GRACE, t1)
        ok = any(re.search(p, line) for kind, nodes in faults
                 if nodes is None or n in nodes or kind not in DISK_KINDS
                 for p in ALLOWED.get(kind, []))
        return ok, ", ".join(sorted({k for k, _ in faults})) or "none"

    def judge(self, n, line, t0, t1):
        if "panicked at" in line:
            self.soak.violate(f"agent {n} panicked: {line.strip()}")
            return
        level = "ERROR" if re.search(r"\bERROR\b", line) else "WARN" if re.search(r"\bWARN\b", line) else None
        if level is None:
            return
        ok, on = self.explains(n, line, t0, t1)
        if ok:
            self.explained += 1
        elif level == "ERROR":
            self.soak.violate(f"an ERROR line in agent-{n}.log that no fault explains "
                              f"(faults on: {on}): {line.strip()}")
        else:
            self.odd_warnings += 1
            self.soak.note(f"a WARN line in agent-{n}.log that no fault explains (faults on: "
                           f"{on}): {line.strip()}")
