#!/usr/bin/env python3
"""The fault injector of tests/jepsen/run: a TCP forwarder, one per network namespace.

Started in node X's namespace as `proxy.py X CONTROL a=10.79.0.11:7500 b=...`, it listens on
127.0.0.1:<port of Y> for every other node Y and forwards to Y's real address over the bridge.
Every node advertises ws://127.0.0.1:<its port>, so every connection between two agents
passes through exactly one of these forwarders (the dialer's), and the link X-Y is one
entry of the control file. This kernel has no netem and no packet-drop actions, so the
faults are made here, in user space, on the byte stream:

- "cut" (a silent partition): the forwarder stops reading and writing both directions of
  every connection of the link and dials nothing for new ones; no FIN, no RST, every socket
  stays open. What was sent is held (in the kernel's buffers), as TCP would retransmit it,
  and flows again when the link heals.
- "lossy" (20% loss, 50+-30 ms delay): every chunk is delivered 20-80 ms after it was read,
  in order. TCP never loses bytes; a lost segment shows to the application as a stall of a
  retransmission timeout, so 20% of chunks also wait 200-1000 ms (and hold back the ones
  behind them). Loss heavy enough also kills connections: each lossy connection is reset
  (SO_LINGER 0, both ends) with probability 3% per second.

The control file is JSON: {"cut": [["a","b"], ...], "lossy": bool}; it is read again when
its mtime changes (polled every 50 ms).
"""
import asyncio
import json
import os
import random
import socket
import struct
import sys

ME = sys.argv[1]
CONTROL = sys.argv[2]
TARGETS = {}
for spec in sys.argv[3:]:
    name, addr = spec.split("=", 1)
    host, port = addr.rsplit(":", 1)
    TARGETS[name] = (host, int(port))

state = {"cut": set(), "lossy": False, "mtime": None}
conns = set()


def cut(peer):
    return frozenset((ME, peer)) in state["cut"]


async def watch_control():
    while True:
        try:
            m = os.stat(CONTROL).st_mtime_ns
            if m != state["mtime"]:
                with open(CONTROL) as f:
                    c = json.load(f)
                state["cut"] = {frozenset(p) for p in c.get("cut", [])}
                state["lossy"] = bool(c.get("lossy", False))
                state["mtime"] = m
        except (OSError, ValueError):
            pass
        await asyncio.sleep(0.05)


def reset(writer):
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
    except OSError:
        pass


class Conn:
    def __init__(self, peer, cr, cw):
        self.peer, self.cr, self.cw = peer, cr, cw
        self.closed = asyncio.Event()

    async def run(self):
        # a cut link: accept (the listener is local) but never dial; hold the socket open
        while cut(self.peer):
            if self.cr.at_eof():
                break
            await asyncio.sleep(0.05)
            if self.cw.is_closing():
                return
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(*TARGETS[self.peer]), 5)
        except (OSError, asyncio.TimeoutError):
            reset(self.cw)
            return
        self.uw = uw
        conns.add(self)
        tasks = [asyncio.create_task(self.pump(self.cr, uw)),
                 asyncio.create_task(self.pump(ur, self.cw)),
                 asyncio.create_task(self.killer())]
        await self.closed.wait()
        for t in tasks:
            t.cancel()
        conns.discard(self)
        for w in (uw, self.cw):
            try:
                w.close()
            except OSError:
                pass

    async def killer(self):
        while True:
            await asyncio.sleep(1)
            if state["lossy"] and not cut(self.peer) and random.random() < 0.03:
                reset(self.uw)
                reset(self.cw)
                self.closed.set()
                return

    async def pump(self, r, w):
        q = asyncio.Queue()

        async def deliver():
            try:
                while True:
                    at, data = await q.get()
                    loop = asyncio.get_running_loop()
                    while True:
                        d = at - loop.time()
                        if d > 0:
                            await asyncio.sleep(d)
                        if not cut(self.peer):
                            break
                        await asyncio.sleep(0.05)
                    if data is None:
                        w.write_eof() if w.can_write_eof() else None
                        return
                    w.write(data)
                    await w.drain()
            except (OSError, ConnectionError, RuntimeError):
                self.closed.set()

        dt = asyncio.create_task(deliver())
        last = 0.0
        try:
            while True:
                while cut(self.peer):
                    await asyncio.sleep(0.05)
                data = await r.read(65536)
                loop = asyncio.get_running_loop()
                now = loop.time()
                at = now
                if state["lossy"]:
                    at = now + random.uniform(0.020, 0.080)
                    if random.random() < 0.20:
                        at += random.uniform(0.2, 1.0)
                at = max(at, last)
                last = at
                await q.put((at, data if data else None))
                if not data:
                    break
            await dt
        except (OSError, ConnectionError):
            pass
        except asyncio.CancelledError:
            dt.cancel()
            raise
        self.closed.set()


async def main():
    asyncio.create_task(watch_control())
    for peer, (host, port) in TARGETS.items():
        async def handle(cr, cw, peer=peer):
            await Conn(peer, cr, cw).run()
        await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"proxy {ME} ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
