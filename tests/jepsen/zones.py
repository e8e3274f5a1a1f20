#!/usr/bin/env python3
"""The three-zone run of tests/jepsen/run-zones (see tests/jepsen/README.md). Root only.

Twelve agents in three zones of four (zone-a: a1..a4, zone-b: b1..b4, zone-c: c1..c4), each
in its own network namespace on a bridge of its own, speaking mutual TLS, every link through
a user-space forwarder (proxy.py), as in jepsen.py, whose helpers this reuses. Zone-c is cut
off from the two others, silently, for 60 s; 10 s in, one agent of zone-a is SIGKILLed. The
checks compare every agent's `roster get jep --all --json` (with each instance's status) with
what the writer was told:

- the other zones keep a cut-off zone's instances, shown `unreachable`, instead of removing
  them (damping: more than --damping-share of a zone lost within --damping-window);
- a single death in a healthy zone (1 of 4, under the share) is still removed in about a
  lease;
- on the heal every instance of a live owner is `passing` again with no re-registration, and
  the dead agent's instances are gone everywhere.

Any violation: one line `zones: FAIL: ...` on stderr and exit 1 (2 when the harness broke).
"""
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ of jepsen.py left in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jepsen  # noqa: E402
from jepsen import Cluster, Fail, Net, Writer, fail, log, sh  # noqa: E402

jepsen.LOG_NAME = "zones"

ZONES = ["zone-a", "zone-b", "zone-c"]
# Four a zone: one death is 25% of its zone, under the default --damping-share of 30%.
# ZONES_PER_ZONE=3 is the lighter fallback (nine agents), with --damping-share 40 so that one
# death (33%) is still under the share.
PER_ZONE = int(os.environ.get("ZONES_PER_ZONE", "4"))
if PER_ZONE not in (3, 4):
    sys.exit("zones: ZONES_PER_ZONE must be 3 or 4")
MEMBERS = {z: [f"{z[-1]}{i + 1}" for i in range(PER_ZONE)] for z in ZONES}
ZONE_OF = {n: z for z, ms in MEMBERS.items() for n in ms}
NAMES = [n for z in ZONES for n in MEMBERS[z]]
NET = Net(NAMES, prefix="jz", bridge="jzbr", subnet="10.77.0", port=7700)
# --damping-share 30 and --damping-window 30s are the defaults; the bound is given so the
# flag is exercised (and exceeds the cut, so nothing expires during it)
DAMPING = ["--damping-bound", "5m"] + (["--damping-share", "40"] if PER_ZONE == 3 else [])

LEASE = jepsen.LEASE
CUT = 60.0  # seconds zone-c is cut off
KILL_AT = 10.0  # seconds into the cut the zone-a agent is SIGKILLed
STRICT_FROM = 15.0  # from then on, every poll during the cut must be right
UNREACH_LIMIT = 30.0  # seconds from the cut's start for every cut-off instance to be `unreachable`
GONE_LIMIT = 15.0  # seconds from the SIGKILL for its instances to be gone from zone-a/b
HEAL_LIMIT = 30.0
CONVERGE_LIMIT = jepsen.CONVERGE_LIMIT
POLL = 1.0  # seconds between polls during the cut
# ZONES_CONTINUE=1 (for diagnosis): a violation is logged and the run goes on to its end (the
# heal, the final check), failing there with the first one, instead of failing at once
CONTINUE = os.environ.get("ZONES_CONTINUE") == "1"
VIOLATIONS = []
SEEN = set()  # kinds of violation already logged
rng = jepsen.rng
SEED = jepsen.SEED
CLUSTER = {}  # "c": the Cluster, for the diagnostics written on a failure


def violate(msg, kind=None):
    """A failure, or with CONTINUE a record of it (each kind logged once)."""
    if not CONTINUE:
        fail(msg)
    kind = kind or msg
    if kind not in SEEN:
        SEEN.add(kind)
        log(f"VIOLATION (going on: ZONES_CONTINUE=1): {msg}")
        VIOLATIONS.append(msg)


def soft(f, *args, **kw):
    """f(...), or None after recording its failure when CONTINUE."""
    try:
        return f(*args, **kw)
    except Fail as e:
        violate(str(e))
        return None


def joins(n):
    """The next two of n's own zone and the agent at n's place in each other zone."""
    z = ZONE_OF[n]
    i = MEMBERS[z].index(n)
    own = [MEMBERS[z][(i + k) % PER_ZONE] for k in (1, 2)]
    return own + [MEMBERS[o][i] for o in ZONES if o != z]


def agent_args(n):
    return ["--zone", ZONE_OF[n]] + DAMPING


# ---- network ------------------------------------------------------------------------------
def net_down():
    """This run's namespaces, veths and bridge, and any other `jz-*` namespace a run with
    other names left."""
    names = set(NAMES)
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(NET.prefix + "-"):
            names.add(ns[len(NET.prefix) + 1:])
    jepsen.net_down(Net(sorted(names), NET.prefix, NET.bridge, NET.subnet, 0))


# ---- views --------------------------------------------------------------------------------
def zview(c, n):
    """{instance: status} of every live instance agent n lists (`get --all`), or None when it
    does not answer."""
    r = c.cli(n, "get", "jep", "--all", "--json", timeout=5)
    if r is None:
        return None
    if r.returncode == 1 and not r.stdout.strip():
        return {}
    if r.returncode != 0:
        return None
    try:
        return {i["instance"]: i.get("status") for i in json.loads(r.stdout)}
    except (ValueError, KeyError, TypeError):
        return None


def zviews(c, nodes, view=zview):
    out = {}
    ts = [threading.Thread(target=lambda m=m: out.__setitem__(m, view(c, m))) for m in nodes]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def record(w):
    with w.lock:
        return {"owner": dict(w.owner), "live": set(w.live), "gone": set(w.gone),
                "unc": set(w.uncertain)}


def judge(rec, views, owners_alive, dead=()):
    """None when every view shows every acknowledged registration of a live owner, `passing`,
    and nothing else (no deregistered, unknown or dead owner's instance); else the problem."""
    owner = rec["owner"]
    want = {i for i in rec["live"] if owner[i] in owners_alive}
    dead_ids = {i for i, o in owner.items() if o in dead}
    for n, v in sorted(views.items()):
        if v is None:
            return f"{n} does not answer"
        ids = set(v)
        back = ids & rec["gone"]
        if back:
            return f"{n} shows {len(back)} deregistered instance(s) again, e.g. {sorted(back)[0]}"
        missing = want - ids
        if missing:
            i = sorted(missing)[0]
            return (f"{n} lacks {len(missing)} acknowledged registration(s) of live owners, "
                    f"e.g. {i} (owner {owner[i]}, {ZONE_OF[owner[i]]})")
        dead_shown = ids & dead_ids
        if dead_shown:
            i = sorted(dead_shown)[0]
            return (f"{n} still shows {len(dead_shown)} instance(s) of dead node(s), e.g. {i} "
                    f"({v[i]})")
        unknown = ids - set(owner)
        if unknown:
            return f"{n} shows instance(s) nobody registered: {sorted(unknown)[:3]}"
        stray = {i for i in ids - want - rec["unc"]}
        if stray:
            return f"{n} shows {len(stray)} instance(s) of owners not alive, e.g. {sorted(stray)[0]}"
        wrong = sorted(i for i in want if v[i] != "passing")
        if wrong:
            i = wrong[0]
            return (f"{n} shows {len(wrong)} instance(s) not passing, e.g. {i} {v[i]} "
                    f"(owner {owner[i]}, {ZONE_OF[owner[i]]})")
    return None


def cross_summary(rec, views):
    """How the instances of the other side show, on each side: a line for the log."""
    owner = rec["owner"]
    out = []
    for what, side, theirs in (("zone-a/b show zone-c's", "ab", ("zone-c",)),
                               ("zone-c shows zone-a/b's", "c", ("zone-a", "zone-b"))):
        count = {}
        for n, v in views.items():
            if (ZONE_OF[n] == "zone-c") != (side == "c"):
                continue
            for i in rec["live"]:
                if ZONE_OF[owner[i]] in theirs and owner[i] != n:
                    k = "?" if v is None else v.get(i, "not listed")
                    count[k] = count.get(k, 0) + 1
        out.append(f"{what}: " + ", ".join(f"{k} {v}" for k, v in sorted(count.items())))
    return "; ".join(out)


def converge(c, w, nodes, owners_alive, what, limit, dead=(), step=0.3, trace=False, marks=None):
    """Poll until judge() finds nothing wrong; the seconds it took. With `trace`, how the
    instances of the other side show is logged whenever it changes; `marks["live"]` is set to
    the seconds until all was right but for the dead owners' instances."""
    t = time.monotonic()
    problem = last = None
    while time.monotonic() - t < limit:
        rec, vs = record(w), zviews(c, nodes)
        problem = judge(rec, vs, owners_alive, dead)
        if marks is not None and "live" not in marks:
            alive_only = {n: None if v is None else
                          {i: s for i, s in v.items() if rec["owner"].get(i) not in dead}
                          for n, v in vs.items()}
            if judge(rec, alive_only, owners_alive) is None:
                marks["live"] = time.monotonic() - t
        if trace:
            line = cross_summary(rec, vs)
            if line != last:
                log(f"{time.monotonic() - t:5.1f} s into {what}: {line}")
                last = line
        if problem is None:
            took = time.monotonic() - t
            log(f"converged: {what}: {took:.1f} s")
            return took
        time.sleep(step)
    fail(f"{what}: not within {limit:.0f} s: {problem}")


def members_view(c, n):
    """{member name: zone} as agent n's `members --json` has them, or None."""
    r = c.cli(n, "members", "--json", timeout=5)
    if r is None or r.returncode != 0:
        return None
    try:
        return {m["name"]: m.get("zone", "(no zone field)") for m in json.loads(r.stdout)}
    except (ValueError, KeyError, TypeError):
        return None


def members_converge(c, limit):
    t = time.monotonic()
    problem = None
    while time.monotonic() - t < limit:
        problem = None
        for n, v in sorted(zviews(c, NAMES, members_view).items()):
            if v is None:
                problem = f"{n}: `members --json` did not answer (or is not a list of members)"
                break
            lacking = sorted(set(NAMES) - {n} - set(v))
            if lacking:
                problem = f"{n} does not list {','.join(lacking)} among its members"
                break
            wrong = sorted(m for m in NAMES if m in v and v[m] != ZONE_OF[m])
            if wrong:
                problem = f"{n} lists {wrong[0]} in zone {v[wrong[0]]!r}, not {ZONE_OF[wrong[0]]}"
                break
        if problem is None:
            took = time.monotonic() - t
            log(f"converged: every agent lists the members with their zones: {took:.1f} s")
            return took
        time.sleep(0.5)
    fail(f"start: members with zones not within {limit:.0f} s: {problem}")


def cpu_seconds():
    """CPU seconds (user + system) the agents and the forwarders have used so far (the
    killed agent's not counted)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"agent": 0.0, "proxy": 0.0}
    for key, p in list(jepsen.procs.items()):
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[key.split("-")[0]] += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError, KeyError):
            pass
    return out


def diagnostics(c, tag):
    """status, members and `get --all` of every live agent, into the work dir."""
    for n in sorted(c.alive):
        with open(os.path.join(c.work, f"{tag}-{n}.txt"), "w") as f:
            for args in (("status",), ("members",), ("get", "jep", "--all")):
                r = c.cli(n, *args, timeout=5)
                f.write(f"$ roster {' '.join(args)}\n")
                f.write("(no answer)\n" if r is None
                        else f"{r.stdout}{r.stderr}(exit {r.returncode})\n")


# ---- the run ------------------------------------------------------------------------------
def run(work):
    results, notes = [], []

    def result(k, v):
        results.append((k, v))

    log(f"seed {SEED} (ROSTER_SEED={SEED} replays the choices), work dir {work}; "
        f"{len(NAMES)} agents in {', '.join(f'{z} ({len(MEMBERS[z])})' for z in ZONES)}")
    jepsen.net_up(NET)
    c = Cluster(work, net=NET, agent_args=agent_args, joins=joins)
    CLUSTER["c"] = c
    c.start_proxies()
    t_start = time.monotonic()
    for n in NAMES:
        c.start_agent(n)
    log(f"{len(NAMES)} agents started in {time.monotonic() - t_start:.1f} s")
    w = Writer(c)

    # 1. registrations on random agents of every zone, a few writes and deregistrations more
    order = [n for n in NAMES for _ in range(3)]
    rng.shuffle(order)
    todo = list(order)
    lock = threading.Lock()

    def registrar():
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop()
            w.register(n)

    ts = [threading.Thread(target=registrar) for _ in range(4)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    w.resume()
    time.sleep(4)
    w.pause()
    log(f"writer: {w.ops}")
    result(f"start: {len(NAMES)} agents converged (every instance passing)",
           converge(c, w, NAMES, set(NAMES), "start", CONVERGE_LIMIT))
    result("start: every agent lists the members with their zones (`members --json`)",
           members_converge(c, CONVERGE_LIMIT))

    # 2-4. zone-c cut off from zone-a and zone-b; a zone-a agent SIGKILLed 10 s in
    za, zb, zc = (MEMBERS[z] for z in ZONES)
    ab = za + zb
    cut = [(x, y) for x in zc for y in NAMES if y not in zc]
    rec = record(w)
    owner = rec["owner"]
    zc_ids = {i for i in rec["live"] if owner[i] in zc}
    victim = rng.choice(sorted({owner[i] for i in rec["live"] if owner[i] in za}))
    victim_ids = {i for i, o in owner.items() if o == victim}
    ab_ids = {i for i in rec["live"] if owner[i] in ab and owner[i] != victim}
    if not zc_ids or not ab_ids:
        raise RuntimeError("the writer left a zone with no acknowledged registration")
    log(f"faults: zone-c cut off from zone-a and zone-b ({len(cut)} links) for {CUT:.0f} s; "
        f"{victim} is SIGKILLed {KILL_AT:.0f} s in; zone-c owns {len(zc_ids)} instances, "
        f"{victim} {len(victim_ids & rec['live'])}")
    c.set_faults(cut=cut)
    t_cut = time.monotonic()
    killed_at = gone_in = None
    unreach = {"ab": None, "c": None}  # seconds from the cut until all shown `unreachable`
    silent = {}
    polls = 0
    plain_checked = False
    early = {}  # kind -> the first problem seen before STRICT_FROM
    last_summary = None

    while time.monotonic() - t_cut < CUT:
        if killed_at is None and time.monotonic() - t_cut >= KILL_AT:
            log(f"SIGKILL {victim} ({time.monotonic() - t_cut:.1f} s into the cut)")
            c.kill_agent(victim)
            killed_at = time.monotonic()
        t_poll = time.monotonic()
        el = t_poll - t_cut
        vs = zviews(c, sorted(c.alive))
        for n, v in vs.items():
            silent[n] = silent.get(n, 0) + 1 if v is None else 0
            if silent[n] == 3:
                violate(f"cut, {el:.0f} s in: {n} did not answer `get --all` three polls in a row",
                        f"silent-{n}")
        live_ab = [n for n in ab if n in c.alive]
        problems = []  # (kind, message)
        summary = []
        for what, nodes, ids in (("zone-a/b show zone-c's", live_ab, zc_ids),
                                 ("zone-c shows zone-a/b's", zc, ab_ids)):
            count = {}
            for n in nodes:
                for i in ids:
                    k = "?" if vs.get(n) is None else vs[n].get(i, "not listed")
                    count[k] = count.get(k, 0) + 1
            summary.append(f"{what}: " + ", ".join(f"{k} {v}" for k, v in sorted(count.items())))
        if summary != last_summary:
            log(f"{el:5.1f} s into the cut: " + "; ".join(summary))
            last_summary = summary

        # 3. the single death in zone-a: gone from zone-a/b within about a lease
        if killed_at is not None and gone_in is None:
            shown = [n for n in live_ab if vs[n] is None or set(vs[n]) & victim_ids]
            if not shown:
                gone_in = time.monotonic() - killed_at
                log(f"{victim}'s instances gone from zone-a/b {gone_in:.1f} s after its SIGKILL")
            elif time.monotonic() - killed_at > GONE_LIMIT:
                n = shown[0]
                st = sorted({vs[n][i] for i in set(vs[n]) & victim_ids}) if vs[n] else "-"
                gone_in = float("nan")
                violate(f"cut: {victim} (1 of {PER_ZONE} in zone-a) SIGKILLed, its instances still "
                     f"listed on {','.join(shown)} {GONE_LIMIT:.0f} s later (on {n} as {st}; "
                     f"lease {LEASE:.0f} s)")

        # 4. zone-a/b keep zone-c's instances, then show them `unreachable`; their own stay passing
        for side, nodes, theirs, ours in (("ab", live_ab, zc_ids, ab_ids),
                                          ("c", zc, ab_ids, zc_ids)):
            for n in nodes:
                v = vs.get(n)
                if v is None:
                    continue
                gone = sorted(theirs - set(v))
                if gone:
                    i = gone[0]
                    problems.append((f"removed-{side}", f"{n} ({ZONE_OF[n]}) no longer lists "
                                     f"{len(gone)} instance(s) of the other side, e.g. {i} "
                                     f"(owner {owner[i]}, {ZONE_OF[owner[i]]})"))
                if unreach[side] is not None:
                    back = sorted(i for i in theirs & set(v) if v[i] != "unreachable")
                    if back:
                        i = back[0]
                        problems.append((f"back-{side}", f"{n} ({ZONE_OF[n]}) shows {i} (owner "
                                         f"{owner[i]}) as {v[i]} again after `unreachable`"))
                bad = sorted(i for i in ours if v.get(i) != "passing")
                if bad:
                    i = bad[0]
                    problems.append((f"own-{side}", f"{n} ({ZONE_OF[n]}) shows {len(bad)} "
                                     f"instance(s) of its own side not passing, e.g. {i} "
                                     f"(owner {owner[i]}) {v.get(i) or 'not listed'}"))
            if unreach[side] is None and all(
                    vs.get(n) is not None and all(vs[n].get(i) == "unreachable" for i in theirs)
                    for n in nodes):
                unreach[side] = el
                log(f"every instance of the other side shown `unreachable` on every agent of "
                    f"{'zone-a/b' if side == 'ab' else 'zone-c'}, {el:.1f} s into the cut")
            if unreach[side] is None and el > UNREACH_LIMIT and f"late-{side}" not in SEEN:
                n = next(n for n in nodes if vs.get(n) is None or any(
                    vs[n].get(i) != "unreachable" for i in theirs))
                seen = {} if vs.get(n) is None else vs[n]
                st = {}
                for i in theirs:
                    st[seen.get(i, "not listed")] = st.get(seen.get(i, "not listed"), 0) + 1
                violate(f"cut: {UNREACH_LIMIT:.0f} s in, {n} ({ZONE_OF[n]}) shows the other "
                        f"side's {len(theirs)} instances as {st}, not all `unreachable`",
                        f"late-{side}")

        # plain `get` (no --all) does not return unreachable instances
        if not plain_checked and unreach["ab"] is not None and el >= 40:
            plain_checked = True
            pv = c.views(live_ab)
            for n in live_ab:
                if pv[n] is not None and pv[n] & zc_ids:
                    problems.append(("plain", f"{n}: `get jep` (without --all) returns "
                                     f"{len(pv[n] & zc_ids)} `unreachable` instance(s) of zone-c"))
                elif pv[n] is not None and ab_ids - pv[n]:
                    problems.append(("plain", f"{n}: `get jep` lacks {len(ab_ids - pv[n])} "
                                     f"passing instance(s) of zone-a/b"))
            log("plain `get jep` on zone-a/b: " + ("right" if not any(
                k == "plain" for k, _ in problems) else "wrong"))

        if problems:
            if el >= STRICT_FROM:
                for kind, msg in problems:
                    violate(f"cut, {el:.0f} s in: {msg}", kind)
            for kind, msg in (problems if el < STRICT_FROM else []):
                if kind not in early:
                    early[kind] = f"{el:.1f} s into the cut: {msg}"
                    log(f"(before {STRICT_FROM:.0f} s, not a failure) {msg}")
        if el >= STRICT_FROM:
            polls += 1
        wait = 0.2 if killed_at is not None and gone_in is None else POLL
        time.sleep(max(0.0, min(wait - (time.monotonic() - t_poll), CUT - (time.monotonic() - t_cut))))

    if gone_in is None:
        raise RuntimeError("the cut ended before the SIGKILL's check did")
    for side in ("ab", "c"):
        if unreach[side] is None:
            unreach[side] = float("nan")
    log(f"cut lasted {time.monotonic() - t_cut:.1f} s; {polls} polls from {STRICT_FROM:.0f} s on"
        + (f", {len(VIOLATIONS)} violation(s)" if VIOLATIONS else ", all right"))
    result(f"cut: zone-c's instances `unreachable` on every zone-a/b agent (from the cut)",
           unreach["ab"])
    result(f"cut: zone-a/b's instances `unreachable` on every zone-c agent (from the cut)",
           unreach["c"])
    result(f"cut: {victim} SIGKILLed {KILL_AT:.0f} s in, its instances gone from zone-a/b "
           f"(lease {LEASE:.0f} s)", gone_in)
    for kind, msg in sorted(early.items()):
        notes.append(f"before {STRICT_FROM:.0f} s into the cut ({kind}): {msg}")

    # 5. heal: every live owner's instances passing again everywhere, the dead one's gone
    c.set_faults(cut=[])
    log("faults: healed")
    live = sorted(c.alive)
    marks = {}
    took = soft(converge, c, w, live, set(live), "the heal", HEAL_LIMIT, dead=(victim,),
                trace=True, marks=marks)
    result("heal: every live agent shows every live owner's instances passing",
           marks.get("live"))
    result(f"heal: that, and {victim}'s instances gone everywhere (zone-c's agents too)", took)

    # 6. nothing acknowledged is lost (jepsen.py's converge: plain `get`)
    result(f"final: the {len(live)} live agents (plain `get`)",
           soft(jepsen.converge, c, w, live, set(live), "final", dead=(victim,)))
    cpu = cpu_seconds()
    wall = time.monotonic() - t_start
    tm = os.times()
    notes.append(f"CPU over the {wall:.0f} s since the agents started: the {len(live)} live "
                 f"agents {cpu['agent']:.0f} s, the {len(NAMES)} forwarders {cpu['proxy']:.0f} s, "
                 f"this script {tm.user + tm.system:.0f} s and the CLI calls it ran (with the "
                 f"killed agent) {tm.children_user + tm.children_system:.0f} s "
                 f"({os.cpu_count()} cores)")
    if VIOLATIONS:
        for k, v in results:
            log(f"measured: {k}: {'-' if v is None else f'{v:.1f}'}")
        for n in notes:
            log(f"note: {n}")
        fail(f"{VIOLATIONS[0]} (and {len(VIOLATIONS) - 1} more violation(s), logged)")
    return results, notes, w, victim, polls


def main():
    if os.geteuid() != 0:
        print("zones: skipped: needs root (network namespaces)", file=sys.stderr)
        return 0
    work = tempfile.mkdtemp(prefix="jepsen-zones.")
    keep = os.environ.get("JEPSEN_KEEP") == "1"

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    net_down()  # leftovers of a run that was killed
    rc = 0
    try:
        results, notes, w, victim, polls = run(work)
        print("| what | seconds |")
        print("|---|---|")
        for k, v in results:
            print(f"| {k} | {'-' if v is None else f'{v:.1f}'} |")
        print(f"\n{len(NAMES)} agents; the cut: {CUT:.0f} s, {polls} polls of every live agent "
              f"from {STRICT_FROM:.0f} s on, all right; writer: {w.ops['register']} "
              f"registrations and {w.ops['deregister']} deregistrations acknowledged, "
              f"{w.ops['failed']} not; seed {SEED}; {time.monotonic() - jepsen.T0:.0f} s in all")
        for n in notes:
            print(f"note: {n}")
        print("zones: PASS")
    except Fail as e:
        print(f"zones: FAIL: {e} (seed {SEED}; logs in {work})", file=sys.stderr)
        keep, rc = True, 1
    except BaseException as e:
        print(f"zones: ERROR: {e!r} (logs in {work})", file=sys.stderr)
        keep, rc = True, 2
    finally:
        if rc == 1 and "c" in CLUSTER:
            try:
                diagnostics(CLUSTER["c"], "diag-fail")
            except Exception:
                pass
        jepsen.stop_all()
        net_down()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
