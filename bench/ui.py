#!/usr/bin/env python3
"""The service map's figures (issue 32), measured in headless Chromium against real agents.

  python3 bench/ui.py ROSTER_BINARY [--trials 20] [--instances 10000] [--idle 30]

Prints a Markdown table (docs/benchmarks.md has the last one):
- register-to-page: `roster register` on agent b, until the instance is on a's page (the
  page's own clock at the moment its row count changed, against the clock before the
  command started: same machine, same clock); the median and the worst of --trials;
- first render of a service with --instances instances: from navigation start to the paint
  that first showed them all (the page records when the rows of each count were drawn);
- page weight: every file of the page as served to a browser that accepts gzip;
- what a read of the services costs, without and with the counts by status;
- idle CPU: agent a's CPU time (utime + stime from /proc) over --idle seconds with nothing
  changing, with a page open on the service of --instances, then without a page.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ui"))
import browser as ui  # noqa: E402  (tests/ui/browser.py: its agents and browser)

COUNT = "return document.querySelector('#count')?.dataset.count"


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(agent, seconds):
    before = cpu_seconds(agent.proc.pid)
    time.sleep(seconds)
    return (cpu_seconds(agent.proc.pid) - before) / seconds * 100


def page_weight(agent):
    total = 0
    for f in ("", "app.js", "style.css"):
        req = urllib.request.Request(f"{agent.http}/ui/{f}", headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req) as r:
            total += len(r.read())
    return total


def read_ms(agent, path, trials=20):
    """The median time of `GET path`, in ms, over `trials` requests."""
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        with urllib.request.urlopen(agent.http + path) as r:
            r.read()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def wait_count(driver, n):
    ui.wait(driver, f"the page shows {n} instances", lambda d: d.execute_script(COUNT) == str(n))


def register_to_page(driver, a, b, trials):
    driver.get(a.http + "/ui/#/service/lat")
    b.roster("register", "lat", "10.1.0.0:80", "--id", "lat-0")
    wait_count(driver, 1)
    driver.execute_script("""
        window.seen = {};
        new MutationObserver(() => {
            const c = document.querySelector('#count').dataset.count;
            if (!(c in window.seen)) window.seen[c] = Date.now();
        }).observe(document.querySelector('#count'), { attributes: true });""")
    out = []
    for i in range(1, trials + 1):
        t0 = time.time() * 1000
        b.roster("register", "lat", f"10.1.0.{i}:80", "--id", f"lat-{i}")
        wait_count(driver, i + 1)
        out.append(driver.execute_script(f"return window.seen['{i + 1}']") - t0)
    return out


def first_render(driver, a, n):
    lines = "".join(json.dumps({"service": "big", "address": f"10.2.{i // 250}.{i % 250}:80",
                                "id": f"big-{i:05}", "meta": {"zone": f"z{i % 3}"}}) + "\n" for i in range(n))
    path = os.path.join(a.dir + "-big.jsonl")
    with open(path, "w") as f:
        f.write(lines)
    a.roster("register", "--from-file", path)
    runs = []
    for _ in range(3):
        driver.get("about:blank")
        driver.get(a.http + "/ui/#/service/big")
        wait_count(driver, n)
        time.sleep(0.2)
        runs.append(int(driver.execute_script("return document.querySelector('#count').dataset.countedAt")))
    return runs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roster")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--instances", type=int, default=10000)
    p.add_argument("--idle", type=int, default=30)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="roster-ui-bench-") as root:
        a = ui.Agent(args.roster, root, "a")
        b = ui.Agent(args.roster, root, "b", join=a.url)
        driver = None
        try:
            driver = ui.browser()
            lat = register_to_page(driver, a, b, args.trials)
            renders = first_render(driver, a, args.instances)
            weight = page_weight(a)
            services_ms, summary_ms = read_ms(a, "/v1/services"), read_ms(a, "/v1/summary")
            # Both idle windows hold the same instances: with the page on a service of
            # 10,000 (its stream open), then with no page.
            time.sleep(2)
            cpu_with = idle_cpu(a, args.idle)
            driver.get("about:blank")
            time.sleep(2)
            cpu_without = idle_cpu(a, args.idle)
        finally:
            if driver:
                driver.quit()
            a.stop()
            b.stop()
    print("| figure | aim | measured |")
    print("|---|---|---|")
    print(f"| `roster register` on another agent to the instance on the page | under 200 ms median | "
          f"{statistics.median(lat):.0f} ms median, {max(lat):.0f} ms worst of {len(lat)} |")
    print(f"| first render of a service with {args.instances:,} instances | under 300 ms | "
          f"{statistics.median(renders)} ms median of {len(renders)} ({', '.join(map(str, renders))}) |")
    print(f"| page weight (all files, gzipped) | under 150 kB | {weight / 1000:.1f} kB |")
    print(f"| `GET /v1/services`, then `GET /v1/summary`, holding {args.instances + args.trials + 1:,} instances | "
          f"`/v1/services` as before | {services_ms:.2f} ms, {summary_ms:.2f} ms (medians of 20) |")
    print(f"| agent's idle CPU, {args.idle} s, nothing changing | no more than without a page | "
          f"{cpu_without:.2f} % without a page, {cpu_with:.2f} % with one open |")


if __name__ == "__main__":
    sys.exit(main())
