#!/usr/bin/env python3
"""How fast a change spreads on a flood and on eager subsets of the links, in a model of
the simulator's network: every node dials `outbound` random others, every message takes a
delay drawn uniformly from 1 to 5 ms, a node forwards a change at once on its eager links
but to the one it came from. Time to every node by Dijkstra; copies are the deltas each
node receives. Trees are ideal: built from the shortest-hop distances from the origin,
which the protocol's trees only approach once that origin's changes have formed them.

Usage: python3 bench/tree-model.py [nodes] [draws per graph] [outbound] [seed]
(defaults 100 30 2 42). Three graphs, a random origin each; prints the seed.
"""

import heapq
import random
import statistics
import sys
from collections import deque


def graph(n, rng, outbound):
    adj = [set() for _ in range(n)]
    for i in range(n):
        dialed = 0
        while dialed < outbound:
            j = rng.randrange(n)
            if j != i and j not in adj[i]:
                adj[i].add(j)
                adj[j].add(i)
                dialed += 1
    return [sorted(a) for a in adj]


def hops_from(adj, origin):
    """Links crossed from `origin` to each node, by breadth-first search."""
    hops = [None] * len(adj)
    hops[origin] = 0
    q = deque([origin])
    while q:
        u = q.popleft()
        for v in adj[u]:
            if hops[v] is None:
                hops[v] = hops[u] + 1
                q.append(v)
    return hops


def spread(n, origin, eager, rng):
    """Time until every node has the change, and copies per node."""
    arrived = [None] * n
    queue = [(0, origin, None)]
    copies = 0
    while queue:
        t, u, sender = heapq.heappop(queue)
        if sender is not None:
            copies += 1
        if arrived[u] is not None:
            continue
        arrived[u] = t
        for v in eager[u]:
            if v != sender:
                heapq.heappush(queue, (t + rng.randint(1, 5), v, u))
    if any(a is None for a in arrived):
        return None, copies / n
    return max(arrived), copies / n


def main():
    args = sys.argv[1:]
    n = int(args[0]) if len(args) > 0 else 100
    draws = int(args[1]) if len(args) > 1 else 30
    outbound = int(args[2]) if len(args) > 2 else 2
    seed = int(args[3]) if len(args) > 3 else 42
    print(f"seed {seed}; {n} nodes, {outbound} outbound links each, {draws} draws on 3 graphs")
    rng = random.Random(seed)
    results = {}
    for _ in range(3):
        adj = graph(n, rng, outbound)
        origin = rng.randrange(n)
        hops = hops_from(adj, origin)

        def parents_at_previous_hop(most):
            eager = [[] for _ in range(n)]
            for v in range(n):
                if v == origin:
                    continue
                ps = [u for u in adj[v] if hops[u] == hops[v] - 1]
                rng.shuffle(ps)
                for u in ps[:most]:
                    eager[u].append(v)
            return eager

        def with_same_hop(share):
            eager = parents_at_previous_hop(n)
            for u in range(n):
                eager[u] += [v for v in adj[u] if hops[v] == hops[u] and rng.random() < share]
            return eager

        def shared(most):
            """The trees of another origin, links used both ways: one tree for every origin."""
            far = hops_from(adj, rng.randrange(n))
            eager = [set() for _ in range(n)]
            for v in range(n):
                ps = [u for u in adj[v] if far[u] == far[v] - 1]
                rng.shuffle(ps)
                for u in ps[:most]:
                    eager[u].add(v)
                    eager[v].add(u)
            return [sorted(e) for e in eager]

        strategies = {
            "flood": adj,
            "shortest-hop tree (1 parent)": parents_at_previous_hop(1),
            "2 parents at the previous hop": parents_at_previous_hop(2),
            "every parent at the previous hop": parents_at_previous_hop(n),
            "those, and half the same-hop links": with_same_hop(0.5),
            "those, and every same-hop link": with_same_hop(1.0),
            "one tree shared by every origin": shared(1),
            "shared, 2 parents at the previous hop": shared(2),
        }
        for name, eager in strategies.items():
            for _ in range(draws):
                results.setdefault(name, []).append(spread(n, origin, eager, rng))
    print("| eager links | mean ms to every node | worst ms | copies per node |")
    print("|---|---|---|---|")
    for name, rs in results.items():
        times = [t for t, _ in rs if t is not None]
        missed = len(rs) - len(times)
        worst = max(times) if times else "-"
        note = f" ({missed} missed a node)" if missed else ""
        print(
            f"| {name} | {statistics.mean(times):.1f}{note} | {worst} | "
            f"{statistics.mean(c for _, c in rs):.2f} |"
        )


if __name__ == "__main__":
    main()
