"""The soak's clients, through both interfaces: the CLI (`roster register/deregister/get/
watch --json` in the agent's namespace, as jepsen.py's writer) and the HTTP API (PUT, DELETE,
GET and `?watch` server-sent events, httpapi.py).

- Writer: registers new instances, registers existing ones again with a new value (an
  update), and deregisters, on random live agents, recording each write in the model.
- Sampler: reads a random agent now and then; every value it shows must have been written.
- CliWatch, SseWatch: follow the service on one agent each, check every event against what
  was written, and fold the events into the instances they say the agent shows (compared
  with the agent at each quiet period, checker.py).
"""
import json
import os
import random
import subprocess
import threading
import time

from httpapi import SERVICE

import jepsen


def write(soak, via, inst, register):
    """One write of `inst` through its owner, recorded in the model: a registration (of a
    new value) or a deregistration. True when acknowledged."""
    m = soak.model
    target = m.begin(inst, via, register)
    n = inst.owner
    if register:
        address, meta = m.values[target]
        if via == "cli":
            args = ["register", SERVICE, address, "--id", inst.iid]
            for k, v in sorted(meta.items()):
                args += ["--meta", f"{k}={v}"]
            ok, why = cli_answer(soak.cluster.cli(n, *args, timeout=6))
        else:
            ok, why = soak.api.put(n, inst.iid, address, meta)
    elif via == "cli":
        ok, why = cli_answer(soak.cluster.cli(n, "deregister", SERVICE, inst.iid, timeout=6))
    else:
        ok, why = soak.api.delete(n, inst.iid)
    kind = "deregister" if not register else ("update" if len(inst.written) > 1 else "register")
    m.end(inst, target, ok, f"{via} {kind}")
    soak.record("writes.log", f"{via} {kind} {inst.iid} w={target} through {n}: "
                              f"{'acknowledged' if ok else 'NOT acknowledged: ' + why}")
    return ok


def cli_answer(r):
    """(acknowledged, why not) of a CLI write."""
    if r is None:
        return False, "no answer within 6 s"
    if r.returncode == 0:
        return True, ""
    return False, f"exit {r.returncode}: {r.stderr.strip()[-300:]}"


def cli_view(soak, n, timeout=5):
    """iid -> (address, meta) agent n serves, through `roster get --json`, or None."""
    r = soak.cluster.cli(n, "get", SERVICE, "--json", timeout=timeout)
    if r is None:
        return None
    if r.returncode == 1 and not r.stdout.strip():
        return {}
    if r.returncode != 0:
        return None
    try:
        return {i["instance"]: (i["address"], i["meta"]) for i in json.loads(r.stdout)}
    except (ValueError, KeyError, TypeError):
        return None


class Writer(threading.Thread):
    def __init__(self, soak, via):
        super().__init__(daemon=True, name=f"writer-{via}")
        self.soak, self.via = soak, via
        self.rng = random.Random(f"{soak.seed}-writer-{via}")
        self.on = threading.Event()
        self.busy = threading.Lock()

    def run(self):
        while not self.soak.stopping:
            if not self.on.wait(0.2):
                continue
            with self.busy:
                if self.on.is_set():
                    self.step()
            time.sleep(self.rng.uniform(0.05, 0.25))

    def pause(self):
        self.on.clear()
        with self.busy:  # a write in flight ends first
            pass

    def step(self):
        m, rng = self.soak.model, self.rng
        owners = self.soak.writable()
        if not owners:
            return
        live = m.live_count()
        new, gone = (0.6, 0.1) if live < 30 else (0.15, 0.45) if live > 70 else (0.35, 0.25)
        r = rng.random()
        if r < new:
            inst = m.new(rng.choice(sorted(owners)), "c" if self.via == "cli" else "h")
            if inst is not None:
                write(self.soak, self.via, inst, True)
            return
        inst = m.pick(rng, owners)
        if inst is not None:
            write(self.soak, self.via, inst, r >= new + gone)


class Sampler(threading.Thread):
    """Reads a random running agent about once a second (CLI and HTTP in turn): no value
    nobody wrote."""

    def __init__(self, soak):
        super().__init__(daemon=True, name="sampler")
        self.soak = soak
        self.rng = random.Random(f"{soak.seed}-sampler")
        self.reads = 0

    def run(self):
        via = "http"
        while not self.soak.stopping:
            time.sleep(self.rng.uniform(0.5, 1.2))
            nodes = sorted(self.soak.running())
            if not nodes:
                continue
            n = self.rng.choice(nodes)
            via = "cli" if via == "http" else "http"
            view = cli_view(self.soak, n) if via == "cli" else self.soak.api.view(n)
            if view is None:
                continue
            self.reads += 1
            for iid, (address, meta) in sorted(view.items()):
                why = self.soak.model.phantom(iid, address, meta)
                if why:
                    self.soak.violate(f"a read of {n} (`get` through {via}) shows a value "
                                      f"nobody wrote: {why}")


class Watch(threading.Thread):
    """What a watch printed, folded: iid -> (address, meta)."""

    def __init__(self, soak, n, kind):
        super().__init__(daemon=True, name=f"watch-{kind}-{n}")
        self.soak, self.node, self.kind = soak, n, kind
        self.lock = threading.Lock()
        self.shown = {}
        self.events = 0
        self.restarts = 0

    def event(self, ev, iid, address, meta):
        """Fold one event; phantom check (meta None: the event carries no metadata)."""
        self.events += 1
        self.soak.record(f"watch-{self.kind}-{self.node}.events",
                         f"{ev} {iid} {address} w={(meta or {}).get('w', '-')}")
        if ev in ("up", "status", "down") and address:
            why = self.soak.model.phantom(iid, address, meta)
            if why:
                self.soak.violate(f"the {self.kind} watch on {self.node} printed a value nobody "
                                  f"wrote ({ev} event): {why}")
        with self.lock:
            if ev == "down":
                self.shown.pop(iid, None)
            elif ev in ("up", "status"):
                self.shown[iid] = (address, meta)

    def reset(self):
        self.soak.record(f"watch-{self.kind}-{self.node}.events", "(a new stream: the fold starts again)")
        with self.lock:
            self.shown = {}

    def folded(self):
        with self.lock:
            return dict(self.shown)


class CliWatch(Watch):
    """`roster watch soak --json` in the agent's namespace. It reconnects by itself when its
    agent goes away; if it ends anyway it is started again (its fold starts again too: a new
    watch prints every instance first)."""

    def __init__(self, soak, n):
        super().__init__(soak, n, "cli")

    def run(self):
        c = self.soak.cluster
        log = open(os.path.join(c.work, f"watch-cli-{self.node}.log"), "ab")
        while not self.soak.stopping:
            self.reset()
            p = subprocess.Popen(
                ["ip", "netns", "exec", c.net.ns[self.node], jepsen.ROSTER, "watch", SERVICE,
                 "--json", "--agent", f"wss://127.0.0.1:{c.net.port[self.node]}",
                 "--tls-ca", c.ca], stdout=subprocess.PIPE, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True)
            jepsen.procs[f"watch-cli-{self.node}"] = p
            for line in p.stdout:
                try:
                    e = json.loads(line)
                except ValueError:
                    self.soak.violate(f"the cli watch on {self.node} printed a line that is not "
                                      f"JSON: {line[:200]!r}")
                    continue
                self.event(e.get("event"), e.get("instance"), e.get("address"), e.get("meta"))
            p.wait()
            if self.soak.stopping:
                return
            self.restarts += 1
            log.write(f"---- soak: the watch ended ({p.returncode}); started again\n".encode())
            log.flush()
            time.sleep(1)


class SseWatch(Watch):
    """`GET /v1/services/soak?watch` on the agent. When the stream breaks (its agent killed
    or stopped), it resumes with the last event id (`Last-Event-ID`): only what changed is
    sent, and the fold goes on. An id the agent refuses starts a fresh stream and fold."""

    def __init__(self, soak, n):
        super().__init__(soak, n, "sse")
        self.last = None

    def run(self):
        while not self.soak.stopping:
            if self.last is None:
                self.reset()
            try:
                last = self.last if self.last is None or len(self.last) <= 60 else self.last[:60] + "..."
                self.soak.record(f"watch-sse-{self.node}.events", f"(connecting, Last-Event-ID {last})")
                for ev, eid, data in self.soak.api.watch(self.node, self.last, timeout=40):
                    data = data or {}
                    self.event(ev, data.get("instance"), data.get("address"), data.get("meta"))
                    if eid is not None:
                        self.last = eid
            except ValueError as e:
                self.soak.record(f"watch-sse-{self.node}.events", f"(Last-Event-ID refused: {e})")
                self.last = None
            except Exception as e:  # noqa: BLE001 - any break of the stream: resume it
                self.soak.record(f"watch-sse-{self.node}.events", f"(the stream broke: {e!r})")
            if self.soak.stopping:
                return
            self.restarts += 1
            time.sleep(0.5)
