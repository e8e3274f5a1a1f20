"""The nemesis's schedule, drawn from the seed alone before the run starts (so a seed replays
the same faults at the same times): windows of faults that overlap, each window followed by
a quiet period. A fault is a dict: its kind, its node(s), when it starts in its window
(`at`), how long it lasts (`span`), and the kind's own fields.

Faults overlap freely but for these rules: a node has at most one process or disk fault at
a time (a restart on a disk that cannot be written fails: that is another test), and one
clock fault; one partition and one set of lossy links at a time; at most (n - 1) // 2 nodes
down or stopped at once.
"""
import random

KINDS = {  # kind: weight
    "kill": 2.0, "stop": 1.5, "term": 1.5, "restore": 1.0,
    "clock": 1.5, "full": 1.0, "eio": 1.0,
    "lossy": 1.5, "silent": 1.0, "ring": 1.0, "oneway": 1.0,
}
DOWN_KINDS = ("kill", "stop", "term", "restore")
PARTITIONS = ("silent", "ring", "oneway")
CALM = 8.0  # seconds a calm partition is alone at the start of its window
CLOCK_CALM = 12.0  # seconds with no other fault after a calm clock comes back
CLOCK_STEPS = ["+365d", "+365d", "+365d", "+2h", "+30s", "-30s", "-2h"]


def draw(seed, windows, length, names):
    """The faults of each window: a list of lists."""
    return [draw_window(random.Random(seed * 1009 + k), length, names) for k in range(windows)]


def draw_window(rng, length, names):
    """Faults for one window. Half the windows open with a calm partition: a silent one
    (two nodes of a side with no direct link, when a side has three) or a ring, alone for
    its first CALM seconds, so the reach probes (reach.py) see a partition and nothing else.
    The other half open with a calm clock: one node's clock +365d for 5-10 s and back, with
    no other fault until CLOCK_CALM seconds after it came back, so the clock probe
    (reach.py's ClockProber) times its recovery with nothing else on."""
    faults = []
    calm_until = 0.0
    if rng.random() < 0.5:
        shape = rng.choice(["silent", "ring"])
        faults.append(dict(partition(rng, shape, names, inner=True), kind=shape, at=1.0,
                           span=round(rng.uniform(CALM + 2, CALM + 10), 1), calm=True))
        calm_until = 1.0 + CALM
    else:
        span = round(rng.uniform(5, 10), 1)
        faults.append({"kind": "clock", "node": rng.choice(names), "offset": "+365d",
                       "at": 1.0, "span": span, "calm": True})
        calm_until = 1.0 + span + CLOCK_CALM
    for _ in range(int(length / 4)):
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        f = make(rng, kind, names)
        if f["span"] > length - 4:
            continue
        f["at"] = round(rng.uniform(1.0, length - f["span"] - 2.0), 1)
        if f["at"] < calm_until:
            continue
        if fits(f, faults, len(names)):
            faults.append(f)
    return sorted(faults, key=lambda f: f["at"])


def make(rng, kind, names):
    n = rng.choice(names)
    u = lambda a, b: round(rng.uniform(a, b), 1)  # noqa: E731
    if kind in ("kill", "term"):
        return {"kind": kind, "node": n, "span": u(1, 8) if kind == "kill" else u(0.5, 6)}
    if kind == "stop":
        return {"kind": kind, "node": n, "span": u(2, 12)}
    if kind == "restore":
        gap, down = u(5, 20), u(1, 4)
        return {"kind": kind, "node": n, "gap": gap, "span": round(gap + down, 1)}
    if kind == "clock":
        return {"kind": kind, "node": n, "offset": rng.choice(CLOCK_STEPS), "span": u(5, 20)}
    if kind in ("full", "eio"):
        return {"kind": kind, "node": n, "span": u(4, 15)}
    if kind == "lossy":
        return {"kind": kind, "nodes": sorted(rng.sample(names, rng.randint(1, len(names)))),
                "span": u(8, 25)}
    return dict(partition(rng, kind, names), kind=kind, span=u(8, 25))


def partition(rng, shape, names, inner=False):
    """cut: directed (dialer, target) pairs; desc: for people. inner: cut a link inside a
    side of three or more (else 60% of the time)."""
    order = rng.sample(names, len(names))
    if shape == "silent":
        k = rng.randint(1, len(names) // 2)
        right, left = sorted(order[:k]), sorted(order[k:])
        cut = {(x, y) for x in left for y in right}
        desc = f"silent partition {{{','.join(left)}}} | {{{','.join(right)}}}"
        if len(left) >= 3 and (inner or rng.random() < 0.6):
            x, y = sorted(rng.sample(left, 2))
            cut.add((x, y))
            desc += f", {x}-{y} cut too (they hear each other only through the rest of their side)"
        cut |= {(y, x) for x, y in cut}
    elif shape == "ring":
        linked = {frozenset((order[i], order[(i + 1) % len(order)])) for i in range(len(order))}
        cut = {(x, y) for x in names for y in names
               if x != y and frozenset((x, y)) not in linked}
        desc = f"ring {'-'.join(order + order[:1])} (every other link cut silently)"
    else:
        x, others = order[0], sorted(order[1:1 + rng.randint(1, len(names) - 1)])
        cut = {(x, y) for y in others}
        desc = f"one-way: {x} cannot dial {','.join(others)} (silently), they can dial {x}"
    return {"cut": sorted(cut), "desc": desc}


def resources(f):
    k = f["kind"]
    if k in DOWN_KINDS or k in ("full", "eio"):
        return {f"pd:{f['node']}"}
    if k == "clock":
        return {f"clock:{f['node']}"}
    if k == "lossy":
        return {"lossy"}
    return {"partition"}


def overlaps(a, b):
    return a["at"] < b["at"] + b["span"] + 1 and b["at"] < a["at"] + a["span"] + 1


def fits(f, faults, n):
    mine = resources(f)
    if any(overlaps(f, g) and mine & resources(g) for g in faults):
        return False
    if f["kind"] in DOWN_KINDS:
        # the most nodes down at once, at the start of each down fault overlapping this one
        downs = [g for g in faults if g["kind"] in DOWN_KINDS and overlaps(f, g)] + [f]
        for g in downs:
            at_once = sum(1 for h in downs if h["at"] <= g["at"] < h["at"] + h["span"] + 1)
            if at_once > (n - 1) // 2:
                return False
    return True


def describe(f):
    k = f["kind"]
    if k == "kill":
        return f"SIGKILL {f['node']}, restarted on its data dir {f['span']} s later"
    if k == "term":
        return f"SIGTERM {f['node']}, restarted on its data dir {f['span']} s later"
    if k == "stop":
        return f"SIGSTOP {f['node']} for {f['span']} s, then SIGCONT"
    if k == "restore":
        return (f"copy {f['node']}'s data dir, {f['gap']} s later SIGKILL it and restore the "
                f"copy, restart {round(f['span'] - f['gap'], 1)} s after")
    if k == "clock":
        return f"step {f['node']}'s clock {f['offset']} for {f['span']} s, then back (no restart)"
    if k == "full":
        return f"fill {f['node']}'s disk for {f['span']} s"
    if k == "eio":
        return f"{f['node']}'s disk returns EIO on writes and syncs for {f['span']} s"
    if k == "lossy":
        return f"loss and delay on the links {','.join(f['nodes'])} dial, for {f['span']} s"
    return f"{f['desc']}, for {f['span']} s"


def plan_text(windows, length):
    lines = []
    for k, faults in enumerate(windows):
        lines.append(f"window {k + 1} ({length:.0f} s of faults, then a quiet period):")
        lines += [f"  +{f['at']:5.1f}s  {describe(f)}" for f in faults]
    return "\n".join(lines)
