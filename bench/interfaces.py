#!/usr/bin/env python3
"""bench/interfaces.py: what the HTTP API and DNS cost and how fast they follow a change.

Three agents on loopback (a, b and c joined to a; gossip 1 s, the default), 10,000
registrations loaded on a with `roster register --from-file` (1,000 services of 10
instances each). Then:

1. HTTP reads on a: GET /v1/services/<one service> over one keep-alive connection,
   median and p99 of `--reads` requests; and GET /v1/services (every service).
2. DNS reads on c: an A query over UDP for one service, median and p99.
3. Propagation: `--changes` registrations made with PUT on a, each followed until c's DNS
   answers with its address: median and max, against the gossip interval.

    python3 bench/interfaces.py [--roster target/release/roster] [--reads 2000] [--changes 50]

Prints one table; every process it starts is stopped by its pid.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time


def start(roster, work, name, extra):
    out = open(os.path.join(work, f"{name}.out"), "w+")
    err = open(os.path.join(work, f"{name}.log"), "w")
    p = subprocess.Popen([roster, "agent", "--listen", "127.0.0.1:0", "--node-name", name,
                          "--data-dir", os.path.join(work, name), "--http-listen", "127.0.0.1:0",
                          "--dns-listen", "127.0.0.1:0"] + extra, stdout=out, stderr=err)
    deadline = time.time() + 20
    while time.time() < deadline:
        out.seek(0)
        text = out.read()
        if "DNS on " in text and "listening on " in text:
            lines = text.splitlines()
            url = next(l.split(" ", 2)[2] for l in lines if l.startswith("listening on "))
            http = next(l.split(" ")[3] for l in lines if l.startswith("HTTP API on "))
            dns = int(next(l for l in lines if l.startswith("DNS on ")).split()[2].rsplit(":", 1)[1])
            return p, url, http, dns
        time.sleep(0.05)
    p.kill()
    sys.exit(f"agent {name} did not start; see {work}/{name}.log")


def dns_query(port, name, qid):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", 1, 1)


def skip_name(r, i):
    """The offset past the (possibly compressed) name at offset i."""
    while r[i] != 0:
        if r[i] & 0xC0 == 0xC0:
            return i + 2
        i += r[i] + 1
    return i + 1


def dns_a(sock, port, name):
    """The A addresses answered for name (a minimal parser: answers follow the question)."""
    qid = random.randrange(1 << 16)
    sock.sendto(dns_query(port, name, qid), ("127.0.0.1", port))
    r, _ = sock.recvfrom(4096)
    ancount = struct.unpack(">H", r[6:8])[0]
    i = skip_name(r, 12) + 4
    addrs = []
    for _ in range(ancount):
        i = skip_name(r, i)
        rtype, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if rtype == 1:
            addrs.append(socket.inet_ntoa(r[i:i + 4]))
        i += rdlen
    return addrs


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--roster", default="target/release/roster")
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--changes", type=int, default=50)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-interfaces.")
    procs = []
    try:
        a, a_url, a_http, _ = start(args.roster, work, "a", [])
        procs.append(a)
        for n in ("b", "c"):
            p, _, _, dns = start(args.roster, work, n, ["--join", a_url])
            procs.append(p)
        c_dns = dns
        lines = os.path.join(work, "load.jsonl")
        with open(lines, "w") as f:
            for s in range(1000):
                for i in range(10):
                    f.write(json.dumps({"service": f"svc-{s}", "id": f"i-{i}",
                                        "address": f"10.{s // 250}.{s % 250}.{i + 1}:80"}) + "\n")
        t = time.time()
        subprocess.run([args.roster, "register", "--from-file", lines, "--agent", a_url],
                       check=True, stdout=subprocess.DEVNULL)
        load_s = time.time() - t
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.settimeout(2)
        while len(dns_a(sock, c_dns, "svc-999.service.roster")) < 10:
            time.sleep(0.1)

        host, port = a_http[len("http://"):].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port))
        reads, lists = [], []
        for k in range(args.reads):
            t = time.perf_counter()
            conn.request("GET", f"/v1/services/svc-{k % 1000}")
            body = conn.getresponse().read()
            reads.append((time.perf_counter() - t) * 1000)
            assert body.count(b'"instance"') == 10, body[:200]
        for _ in range(20):
            t = time.perf_counter()
            conn.request("GET", "/v1/services")
            conn.getresponse().read()
            lists.append((time.perf_counter() - t) * 1000)
        dns_ms = []
        for k in range(args.reads):
            t = time.perf_counter()
            got = dns_a(sock, c_dns, f"svc-{k % 1000}.service.roster")
            dns_ms.append((time.perf_counter() - t) * 1000)
            assert len(got) == 10, got

        follow = []
        for k in range(args.changes):
            addr = f"10.200.{k // 250}.{k % 250 + 1}"
            t = time.perf_counter()
            conn.request("PUT", f"/v1/services/fresh/instances/f-{k}",
                         body=json.dumps({"address": f"{addr}:80"}),
                         headers={"content-type": "application/json"})
            conn.getresponse().read()
            while addr not in dns_a(sock, c_dns, "fresh.service.roster"):
                time.sleep(0.001)
            follow.append((time.perf_counter() - t) * 1000)
            time.sleep(random.uniform(0, 0.2))

        print(f"roster {args.roster}; 3 agents on loopback, 10,000 registrations "
              f"(loaded in {load_s:.1f} s)")
        print("| what | median | p99 / max |")
        print("|---|---|---|")
        print(f"| HTTP GET /v1/services/<service> (10 instances), {args.reads} reads | "
              f"{statistics.median(reads):.3f} ms | p99 {pct(reads, 0.99):.3f} ms |")
        print(f"| HTTP GET /v1/services (1,001 services), 20 reads | "
              f"{statistics.median(lists):.2f} ms | max {max(lists):.2f} ms |")
        print(f"| DNS A <service>.service.roster on another agent, {args.reads} queries | "
              f"{statistics.median(dns_ms):.3f} ms | p99 {pct(dns_ms, 0.99):.3f} ms |")
        print(f"| PUT on a until c's DNS answers it, {args.changes} changes | "
              f"{statistics.median(follow):.1f} ms | max {max(follow):.1f} ms |")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
