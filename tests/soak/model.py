"""What the soak's clients were told: every write, and for every instance the states a
converged cluster may show it in.

A state is ABSENT or the sequence number of a registration (each write has its own, and its
own value: an address and the metadata {"w": seq, "via": cli|http}). An acknowledged write
leaves one allowed state, its own. A write that was not acknowledged (an error, a timeout, a
kill while it was in flight) may or may not have happened: the instance may show the state
before it or after it, and the clients write it no more ("frozen") until a quiet period
settles it to what every agent shows. An instance is always written through its owner, one
write at a time.

Leases: every check runs with every agent alive (a quiet period restarts the killed ones),
so every owner is alive and its instances must be shown: jepsen.py's `owners_alive` is all.
A data directory restored from a copy takes its owner's instances back to what the copy
held (`snapshot`, `restore`): writes acknowledged after the copy are undone.
"""
import threading

ABSENT = None


def value(seq, via):
    """The address and metadata that write `seq` registers."""
    return f"10.{100 + (seq >> 16) % 100}.{(seq >> 8) & 255}.{seq & 255}:{1024 + seq % 50000}", \
        {"w": str(seq), "via": via}


class Inst:
    __slots__ = ("iid", "owner", "allowed", "written", "frozen", "busy", "pinned")

    def __init__(self, iid, owner):
        self.iid, self.owner = iid, owner
        self.allowed = {ABSENT}
        self.written = set()  # every registration attempted, acknowledged or not
        self.frozen = False
        self.busy = False
        self.pinned = False  # a probe waits on it: the writers leave it alone

    def present(self):
        return len(self.allowed) == 1 and next(iter(self.allowed)) is not ABSENT


class Model:
    def __init__(self):
        self.lock = threading.Condition()
        self.insts = {}
        self.values = {}  # seq -> (address, meta)
        self.seq = 0
        self.blocked = set()  # owners the clients must not write through now
        self.stats = {}

    def count(self, what):
        self.stats[what] = self.stats.get(what, 0) + 1

    # ---- writing -------------------------------------------------------------------------
    def new(self, owner, prefix):
        """A new instance owned by `owner`, busy (the caller registers it next), or None
        while the nemesis holds `owner`."""
        with self.lock:
            if owner in self.blocked:
                return None
            self.seq += 1
            inst = Inst(f"{prefix}{self.seq}-{owner}", owner)
            inst.busy = True
            self.insts[inst.iid] = inst
            return inst

    def begin(self, inst, via, register):
        """Record the start of a write (the instance is busy): its target state."""
        with self.lock:
            inst.busy = True
            if not register:
                return ABSENT
            self.seq += 1
            self.values[self.seq] = value(self.seq, via)
            inst.written.add(self.seq)
            return self.seq

    def end(self, inst, target, acked, kind):
        with self.lock:
            inst.busy = False
            if acked:
                inst.allowed = {target}
            else:
                inst.allowed = inst.allowed | {target}
                inst.frozen = True
            self.count(f"{kind} {'acknowledged' if acked else 'not acknowledged'}")
            self.lock.notify_all()

    def pick(self, rng, owners, want_present=True):
        """A random instance a client may write now, owned by one of `owners`, or None."""
        with self.lock:
            ok = [i for i in self.insts.values()
                  if i.owner in owners and i.owner not in self.blocked and not i.busy
                  and not i.frozen and not i.pinned and i.present() == want_present]
            if not ok:
                return None
            inst = rng.choice(sorted(ok, key=lambda i: i.iid))
            inst.busy = True
            return inst

    def release(self, inst):
        with self.lock:
            inst.busy = False
            self.lock.notify_all()

    def live_count(self):
        with self.lock:
            return sum(1 for i in self.insts.values() if ABSENT not in i.allowed)

    # ---- the nemesis's hold on an owner --------------------------------------------------
    def block(self, owner, limit=15.0):
        """No new write through `owner`; wait for those in flight to end."""
        with self.lock:
            self.blocked.add(owner)
            self.lock.wait_for(lambda: not any(i.busy for i in self.insts.values()
                                               if i.owner == owner), limit)

    def unblock(self, owner):
        with self.lock:
            self.blocked.discard(owner)

    def snapshot(self, owner):
        """What a copy of `owner`'s data dir holds (taken while `owner` is blocked)."""
        with self.lock:
            return {i.iid: (set(i.allowed), i.frozen) for i in self.insts.values()
                    if i.owner == owner}

    def restore(self, owner, snap):
        """`owner`'s data dir is back to the copy `snap` describes: its instances are as the
        copy had them; those registered after the copy are gone."""
        with self.lock:
            for i in self.insts.values():
                if i.owner == owner:
                    i.allowed, i.frozen = snap.get(i.iid, ({ABSENT}, True))
                    i.allowed = set(i.allowed)

    # ---- reading -------------------------------------------------------------------------
    def state_of(self, iid, shown):
        """The state a shown (address, meta) is, ABSENT for None, or "phantom" when nobody
        wrote that value for that instance."""
        if shown is None:
            return ABSENT
        with self.lock:
            inst = self.insts.get(iid)
            try:
                seq = int(shown[1].get("w", ""))
            except ValueError:
                return "phantom"
            if inst is None or seq not in inst.written or self.values.get(seq) != tuple(shown):
                return "phantom"
            return seq

    def phantom(self, iid, address=None, meta=None):
        """Why a value a read or a watch showed was never written, or None. `meta` None: only
        the address is known (an SSE `down` event); an empty address: not even that."""
        with self.lock:
            inst = self.insts.get(iid)
            if inst is None:
                return f"instance {iid} was never registered"
            if meta is None:
                addrs = {self.values[s][0] for s in inst.written}
                if address and address not in addrs:
                    return f"{iid} shown at {address}, an address never written for it"
                return None
        if self.state_of(iid, (address, meta)) == "phantom":
            return f"{iid} shown as {address} {meta}, a value never written for it"
        return None

    def expected(self):
        """iid -> (owner, allowed states)."""
        with self.lock:
            return {i.iid: (i.owner, set(i.allowed)) for i in self.insts.values()}

    def describe(self, state):
        if state == "phantom":
            return "a value nobody wrote"
        if state is ABSENT:
            return "absent"
        return f"write {state}" if isinstance(state, int) else str(state)

    def settle(self, shown):
        """After a convergence: every instance is in the state every agent shows (`shown`:
        iid -> state), so the frozen ones may be written again."""
        with self.lock:
            for i in self.insts.values():
                s = shown.get(i.iid, ABSENT)
                if s in i.allowed and not i.busy:
                    i.allowed, i.frozen = {s}, False
