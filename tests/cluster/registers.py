#!/usr/bin/python3
"""Registers over NBD: the client and the checker of stria's cluster tests.

Each 4 KiB block of a volume is a register. Every write stores a value no other write stores,
(writer, seq), so a read tells exactly which write it saw. Clients (`run`, one process per writer)
write and read random blocks through whichever node serves the volume, log every operation with
its real-time interval, and fail over between nodes; `check` reads the final state of every block
and proves, per register, that no acknowledged write was lost and that the history is
linearizable.

Block content of value (writer, seq) at block b:
  0..8    b'STRIAREG'
  8..16   b, u64 LE
  16..20  writer, u32 LE
  20..28  seq, u64 LE
  28..32  CRC32 (zlib.crc32) of bytes 0..28 and 32..4096
  32..4096  filler: the sha256 of bytes 0..28, repeated (so it depends on block, writer, seq)
A block of zeros is "never written" (value None); anything else is a corrupt value.

Log (one JSON object a line, flushed per line; times are time.monotonic(), so every log of one
check must come from one host):
  {"op": "write"|"read", "block": b, "value": [writer, seq] | null, "invoke": t0,
   "complete": t1 | null, "outcome": "ok"|"fail"|"info", "uri": URI, ...}
  - write ok: acknowledged (with FUA). write info: error reply, timeout or lost connection; the
    write may or may not have happened, now or later (complete null = +infinity). Writes never
    log "fail".
  - read ok: value is what was read (null = zeros); a read of bytes that are neither zeros nor a
    valid register of that block logs "corrupt": true and "detail". read fail: no answer (ignored
    by the check).
  - non-ok records carry "error". A client stopped by SIGTERM/SIGINT logs its in-flight
    operation as info/fail before leaving; a SIGKILLed client may lose the record of a write it
    issued, which the check would then report as invented data, so never SIGKILL a client.

Checks, per register (block), over the merged logs plus one final read of every block made by
`check` (a read invoked and completed after everything else):
  a. invented data: every value read (logs and final state) is None or the value of a write of
     that block in the logs; corrupt reads are invented data.
  b. lost acknowledged write: with A the acknowledged write of the block that completed last, the
     final value is A's or that of a write w not strictly before A in real time (not
     w.complete < A.invoke; info writes never complete). Final None only if no write of the
     block was acknowledged.
  c. linearizability of the register's history: ok and info writes, ok reads, the final read.
     See `linearizability_violations` for the algorithm and its proof; `selftest` cross-checks
     it against an exhaustive search.

Usage (run with /usr/bin/python3: python3-libnbd is Debian's):
  registers.py run --uris URI[,URI...] --blocks N --seconds S --writer W --log FILE
                   [--timeout SEC] [--read-fraction F] [--seed X]
      URIs are nbd://HOST:PORT/EXPORT (any libnbd URI works). Prints a JSON summary; exits 1 if a
      read returned corrupt data, 2 on a usage or setup error.
  registers.py check --log FILE [--log FILE ...] --uris URI[,...] --blocks N [--timeout SEC]
      Prints a JSON report; exits 0 when there is no violation, 1 otherwise, 2 on bad input.
  registers.py selftest
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import math
import os
import random
import signal
import struct
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Optional

BLOCK = 4096
MAGIC = b"STRIAREG"
HEAD = struct.Struct("<8sQIQ")  # magic, block, writer, seq: 28 bytes
CRC = struct.Struct("<I")
FILLER_LEN = BLOCK - HEAD.size - CRC.size
ZERO = bytes(BLOCK)
INF = math.inf
FINAL_CHUNK = 32  # blocks per read of the final state
MAX_PRINTED = 20

Value = tuple[int, int]  # (writer, seq)


# ---------------------------------------------------------------------------------------------
# Block content


def encode(block: int, writer: int, seq: int) -> bytes:
    head = HEAD.pack(MAGIC, block, writer, seq)
    filler = (hashlib.sha256(head).digest() * (FILLER_LEN // 32 + 1))[:FILLER_LEN]
    crc = zlib.crc32(filler, zlib.crc32(head))
    return head + CRC.pack(crc) + filler


def decode(block: int, data: bytes) -> tuple[Optional[Value], Optional[str]]:
    """Returns (value, None) for a valid register of `block` (value None for zeros), or
    (None, description) for anything else."""
    data = bytes(data)
    if len(data) != BLOCK:
        return None, f"{len(data)} bytes instead of {BLOCK}"
    if data == ZERO:
        return None, None
    magic, b, writer, seq = HEAD.unpack_from(data)
    if magic != MAGIC:
        return None, f"no register header (first bytes {data[:16].hex()})"
    (crc,) = CRC.unpack_from(data, HEAD.size)
    if crc != zlib.crc32(data[HEAD.size + CRC.size:], zlib.crc32(data[:HEAD.size])):
        return None, f"bad CRC (header says block {b} value {writer}:{seq})"
    if b != block:
        return None, f"the register of block {b} (value {writer}:{seq})"
    if data != encode(block, writer, seq):
        return None, f"filler does not match value {writer}:{seq}"
    return (writer, seq), None


# ---------------------------------------------------------------------------------------------
# History model and checker


@dataclass(slots=True)
class Op:
    kind: str  # "write" | "read"
    block: int
    value: Optional[Value]
    invoke: float
    complete: float  # INF for info writes
    outcome: str  # "ok" | "fail" | "info"
    corrupt: bool = False
    detail: str = ""
    source: str = ""  # "FILE:LINE" or "final"

    def describe(self) -> str:
        what = "wrote" if self.kind == "write" else "read"
        end = "inf" if self.complete == INF else f"{self.complete:.6f}"
        src = f" ({self.source})" if self.source else ""
        return f"{what} {fmt_value(self.value)} [{self.invoke:.6f}, {end}] {self.outcome}{src}"


@dataclass(slots=True)
class Violation:
    block: int
    kind: str  # "invented" | "lost_ack" | "linearizability" | "duplicate_write" | "unavailable"
    details: str

    def to_json(self) -> dict:
        return {"block": self.block, "kind": self.kind, "details": self.details}


@dataclass
class Counts:
    registers: int = 0
    ops_checked: int = 0
    writes_ok: int = 0
    writes_info: int = 0
    writes_info_dropped: int = 0
    reads_ok: int = 0
    reads_fail: int = 0
    final_reads: int = 0
    values_checked: int = 0  # (a): reads whose value was looked up
    lost_ack_checked: int = 0  # (b): registers with a final value
    lin_checked: int = 0  # (c): registers whose history was checked


def fmt_value(v: Optional[Value]) -> str:
    return "zeros" if v is None else f"{v[0]}:{v[1]}"


@dataclass(slots=True)
class Cluster:
    """A written value with the reads that returned it (value None: the initial value's reads)."""
    value: Optional[Value]
    ops: list[Op]
    f_op: Op = field(init=False)  # the op with the earliest completion
    s_op: Op = field(init=False)  # the op with the latest invocation

    def __post_init__(self) -> None:
        self.f_op = min(self.ops, key=lambda o: o.complete)
        self.s_op = max(self.ops, key=lambda o: o.invoke)

    @property
    def f(self) -> float:
        return self.f_op.complete

    @property
    def s(self) -> float:
        return self.s_op.invoke


# Block-device semantics for writes that were never acknowledged (set by `check`): such a write
# may have landed in part, be read, and be gone again after a failover, as data in a disk's
# volatile cache may after a power cut (the cluster simulation met it: a mirror write reached one
# copy, a read returned it, the coordinator died, and the successor's recovery kept the other
# copy). Its value then constrains nothing; acknowledged writes are checked in full.
INFO_MAY_VANISH = False


def linearizability_violations(block: int, writes: dict[Value, Op], reads: list[Op]
                               ) -> tuple[list[Violation], int]:
    """Checks that the history of one register is linearizable; returns (violations, number of
    info writes dropped). `writes` maps each value to the write of it (ok or info, complete INF
    for info); `reads` are the ok reads (and the final read), each of None or of a value in
    `writes`.

    Real-time order: a -> b iff a.complete < b.invoke. A linearization is a total order of the
    operations extending -> in which every read returns the value of the latest write before it
    (None if there is none). An info write whose value nobody read is dropped: it may not have
    happened, and dropping it never changes the answer (in a linearization nothing can sit
    between it and the next write, so removing it keeps the order valid; conversely, never
    completing, it can always be appended at the very end).

    1. Clusters. Values are unique, so in a linearization the write of v and the reads of v form
       one contiguous run that starts with the write: any operation between w_v and a read of v
       would be a read of v. The reads of None form a run at the start. A linearization is thus
       an order of clusters, each laid out as "write, then its reads", and such an order is a
       linearization iff it extends ->.
    2. Inside a cluster the write can come first iff no read of v completed before w_v was
       invoked (r -> w_v); the reads among themselves follow any extension of ->.
    3. Between clusters, X must come before Y iff some x in X, y in Y have x -> y, i.e. iff
       f(X) < s(Y), where f(X) is the earliest completion in X and s(Y) the latest invocation in
       Y. The None cluster must come first. An order of clusters meeting all these constraints
       exists iff the constraint graph has no cycle.
    4. Lemma: if a graph with edges X -> Y iff f(X) < s(Y) (X != Y) has a cycle, it has one of
       length 2. Take a shortest cycle X1 .. Xm, m >= 3. The chord Xi -> X(i+2) would make a
       shorter cycle, so f(Xi) >= s(X(i+2)), and the edge X(i+1) -> X(i+2) gives
       s(X(i+2)) > f(X(i+1)); hence f(X(i+1)) < f(Xi) all around the cycle: impossible.
    5. So the history is linearizable iff
       (i)   no read completed before the write of its value was invoked;
       (ii)  no read of None was invoked after an operation of a written value completed
             (f(X) < s(None): the initial cluster could not come first);
       (iii) no two written values X != Y have f(X) < s(Y) and f(Y) < s(X).
       In Gibbons and Korach's terms, with the zone of X running from f(X) to s(X) (forward when
       f < s, backward otherwise), (iii) says no two forward zones overlap and no backward zone
       lies inside a forward zone; two backward zones never conflict.
    6. (iii) in O(k log k): sort the clusters by f; the X with f(X) < s(Y) are a prefix of that
       order; keeping the two largest s of every prefix (so that Y itself can be left out), a
       conflict with Y exists iff the largest s(X), X != Y, of its prefix exceeds f(Y).
    """
    out: list[Violation] = []
    readers: dict[Optional[Value], list[Op]] = defaultdict(list)
    for r in reads:
        readers[r.value].append(r)
    clusters: list[Cluster] = []
    dropped = 0
    for v, w in writes.items():
        if w.outcome != "ok" and (v not in readers or INFO_MAY_VANISH):
            dropped += 1
            readers.pop(v, None)
            continue
        for r in readers.get(v, ()):
            if r.complete < w.invoke:  # (i)
                out.append(Violation(block, "linearizability",
                                     f"a read returned {fmt_value(v)} before it was written: "
                                     f"{r.describe()} completed before {w.describe()}"))
        clusters.append(Cluster(v, [w, *readers.get(v, ())]))
    initial = readers.get(None)
    if initial and clusters:  # (ii)
        s0 = Cluster(None, initial).s_op
        first = min(clusters, key=lambda c: c.f)
        if first.f < s0.invoke:
            out.append(Violation(block, "linearizability",
                                 f"zeros read after value {fmt_value(first.value)} was in place: "
                                 f"{first.f_op.describe()} completed before {s0.describe()}"))
    # (iii)
    order = sorted(range(len(clusters)), key=lambda i: clusters[i].f)
    fs = [clusters[i].f for i in order]
    top: list[tuple[tuple[float, int], tuple[float, int]]] = []  # per prefix length - 1
    best, second = (-INF, -1), (-INF, -1)
    for i in order:
        cand = (clusters[i].s, i)
        if cand > best:
            best, second = cand, best
        elif cand > second:
            second = cand
        top.append((best, second))
    seen: set[tuple[int, int]] = set()
    for y, cy in enumerate(clusters):
        k = bisect.bisect_left(fs, cy.s)  # clusters X with f(X) < s(Y)
        if k == 0:
            continue
        best, second = top[k - 1]
        s_x, x = best if best[1] != y else second
        if x < 0 or not s_x > cy.f:
            continue
        pair = (min(x, y), max(x, y))
        if pair in seen:
            continue
        seen.add(pair)
        cx = clusters[x]
        out.append(Violation(block, "linearizability",
                             f"values {fmt_value(cx.value)} and {fmt_value(cy.value)} must each "
                             f"come before the other: {cx.f_op.describe()} completed before "
                             f"{cy.s_op.describe()}, and {cy.f_op.describe()} completed before "
                             f"{cx.s_op.describe()}"))
    return out, dropped


def check_register(block: int, ops: list[Op], final: Optional[Op], counts: Optional[Counts] = None
                   ) -> list[Violation]:
    """Checks a, b and c for one register. `final` is the final read (or None if the final state
    could not be read), invoked and completed after every operation in `ops`."""
    c = counts if counts is not None else Counts()
    c.registers += 1
    out: list[Violation] = []
    writes: dict[Value, Op] = {}
    for op in ops:
        if op.kind != "write" or op.outcome not in ("ok", "info"):
            continue
        if op.value is None:
            out.append(Violation(block, "invented", f"a write without a value: {op.describe()}"))
            continue
        if op.value in writes:
            out.append(Violation(block, "duplicate_write",
                                 f"value {fmt_value(op.value)} written twice (a writer id reused?):"
                                 f" {writes[op.value].describe()} and {op.describe()}"))
            continue
        writes[op.value] = op
        if op.outcome == "ok":
            c.writes_ok += 1
        else:
            c.writes_info += 1
    reads = [op for op in ops if op.kind == "read" and op.outcome == "ok"]
    c.reads_ok += len(reads)
    c.reads_fail += sum(1 for op in ops if op.kind == "read" and op.outcome != "ok")
    if final is not None:
        c.final_reads += 1
        reads.append(final)
    c.ops_checked += len(writes) + len(reads)

    valid: list[Op] = []
    for r in reads:  # (a)
        c.values_checked += 1
        if r.corrupt:
            out.append(Violation(block, "invented",
                                 f"read corrupt data ({r.detail}): {r.describe()}"))
        elif r.value is not None and r.value not in writes:
            out.append(Violation(block, "invented",
                                 f"read a value no write of this block wrote: {r.describe()}"))
        else:
            valid.append(r)

    if final is not None and not final.corrupt and (final.value is None or final.value in writes):
        c.lost_ack_checked += 1  # (b)
        acked = [w for w in writes.values() if w.outcome == "ok"]
        if acked:
            last = max(acked, key=lambda w: w.complete)
            if final.value is None:
                out.append(Violation(block, "lost_ack",
                                     f"final state is zeros after {len(acked)} acknowledged "
                                     f"write(s), the last {last.describe()}"))
            else:
                w = writes[final.value]
                if w.complete < last.invoke:
                    out.append(Violation(block, "lost_ack",
                                         f"final value {fmt_value(final.value)} is older than an "
                                         f"acknowledged write: {w.describe()} completed before "
                                         f"{last.describe()}"))

    c.lin_checked += 1  # (c)
    lin, dropped = linearizability_violations(block, writes, valid)
    c.writes_info_dropped += dropped
    return out + lin


def check_history(ops: list[Op], final: dict[int, tuple[Optional[Value], Optional[str]]],
                  blocks: int) -> tuple[list[Violation], Counts]:
    """Checks every register. `final` maps a block to its decoded final content; blocks of
    0..blocks-1 missing from it could not be read (an "unavailable" violation)."""
    counts = Counts()
    times = [t for op in ops for t in (op.invoke, op.complete) if t != INF]
    t_end = (max(times) if times else 0.0) + 1.0
    by_block: dict[int, list[Op]] = defaultdict(list)
    for op in ops:
        by_block[op.block].append(op)
    out: list[Violation] = []
    unread = [b for b in range(blocks) if b not in final]
    if unread:
        out.append(Violation(unread[0], "unavailable",
                             f"the final state of {len(unread)} block(s) could not be read "
                             f"(first {unread[0]}); they were checked without it"))
    for b in sorted(set(range(blocks)) | set(by_block)):
        fin = None
        if b in final:
            value, bad = final[b]
            fin = Op("read", b, value, t_end, t_end + 1.0, "ok", corrupt=bad is not None,
                     detail=bad or "", source="final")
        out.extend(check_register(b, by_block.get(b, []), fin, counts))
    return out, counts


# ---------------------------------------------------------------------------------------------
# Exhaustive reference (selftest)


def brute_force_linearizable(ops: list[Op]) -> bool:
    """Searches every total order consistent with real time (memoized on the set placed and the
    current value). Info writes may be left out; ok writes and reads must all be placed."""
    ops = [o for o in ops if (o.kind == "write" and o.outcome in ("ok", "info"))
           or (o.kind == "read" and o.outcome == "ok")]
    if any(o.corrupt for o in ops):
        return False
    n = len(ops)
    preds = [sum(1 << j for j in range(n) if j != i and ops[j].complete < ops[i].invoke)
             for i in range(n)]
    full = (1 << n) - 1

    @lru_cache(maxsize=None)
    def go(mask: int, cur: Optional[Value]) -> bool:
        if mask == full:
            return True
        for i in range(n):
            bit = 1 << i
            if mask & bit or preds[i] & ~mask:
                continue
            op = ops[i]
            if op.kind == "write":
                if go(mask | bit, op.value):
                    return True
                if op.outcome == "info" and go(mask | bit, cur):  # it never happened
                    return True
            elif op.value == cur and go(mask | bit, cur):
                return True
        return False

    return go(0, None)


# ---------------------------------------------------------------------------------------------
# NBD client: only the asynchronous API, every wait bounded by a deadline

nbd = None  # the libnbd module, imported by need_nbd()


def need_nbd():
    global nbd
    if nbd is None:
        try:
            import nbd as mod
        except ImportError:
            sys.exit(f"registers.py: needs python3-libnbd (Debian's; run with /usr/bin/python3, "
                     f"not {sys.executable})")
        nbd = mod
    return nbd


class NbdError(Exception):
    """An error reply, a timeout or a lost connection."""


class Client:
    """One connection. Every call returns or raises NbdError by its deadline, whatever the
    server does (accepts and never answers, pauses, dies)."""

    def __init__(self, uri: str, timeout: float):
        need_nbd()
        self.uri = uri
        self.timeout = timeout
        self.h = nbd.NBD()
        self.h.set_handle_name(f"registers-{os.getpid()}")
        try:
            self.h.aio_connect_uri(uri)
        except nbd.Error as e:
            self.h = None
            raise NbdError(f"connect: {e}") from None
        try:
            self._drive(self.h.aio_is_ready, time.monotonic() + timeout, "connect")
        except NbdError:
            self.close()
            raise
        self.size = self.h.get_size()
        self.fua = self.h.can_fua()

    def _drive(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        h = self.h
        if h is None:
            raise NbdError(f"{what}: connection closed")
        while True:
            try:
                if done():
                    return
                if h.aio_is_dead() or h.aio_is_closed():
                    raise NbdError(f"{what}: connection lost")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NbdError(f"{what}: no answer in {self.timeout:g} s")
                h.poll(max(1, min(100, math.ceil(left * 1000))))
            except nbd.Error as e:
                raise NbdError(f"{what}: {e}") from None

    def _command(self, issue: Callable[[], int], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        if self.h is None:
            raise NbdError(f"{what}: connection closed")
        try:
            cookie = issue()
        except nbd.Error as e:
            raise NbdError(f"{what}: {e}") from None
        self._drive(lambda: self.h.aio_command_completed(cookie), deadline, what)

    def read(self, offset: int, length: int) -> bytes:
        buf = nbd.Buffer(length)
        self._command(lambda: self.h.aio_pread(buf, offset), "read")
        return bytes(buf.to_bytearray())

    def write(self, data: bytes, offset: int) -> None:
        """A FUA write (a write then a flush where the server has no FUA)."""
        if self.fua:
            self._command(lambda: self.h.aio_pwrite(data, offset, flags=nbd.CMD_FLAG_FUA), "write")
        else:
            self._command(lambda: self.h.aio_pwrite(data, offset), "write")
            self._command(lambda: self.h.aio_flush(), "flush")

    def close(self, graceful: bool = False) -> None:
        """Drops the connection; `graceful` first sends NBD_CMD_DISC (bounded, never waits for
        commands in flight)."""
        h, self.h = self.h, None
        if h is None:
            return
        if graceful:
            try:
                if h.aio_is_ready() and h.aio_in_flight() == 0:
                    h.aio_disconnect(0)
                    deadline = time.monotonic() + 0.2
                    while time.monotonic() < deadline:
                        if h.aio_is_closed() or h.aio_is_dead():
                            break
                        h.poll(20)
            except nbd.Error:
                pass
        del h  # nbd_close: closes the socket, retires whatever is in flight


def connect_any(uris: list[str], start: int, timeout: float, deadline: float, blocks: int,
                on_fail: Callable[[float, str, str], None] = lambda t, uri, err: None
                ) -> tuple[Optional[Client], int]:
    """Tries the URIs round-robin from `start`, a pause of 100 ms after each round, until one
    connects or `deadline` passes. Returns (client or None, index of its URI)."""
    i = start % len(uris)
    while True:
        for _ in range(len(uris)):
            now = time.monotonic()
            if now >= deadline:
                return None, i
            uri = uris[i]
            try:
                c = Client(uri, min(timeout, max(0.001, deadline - now)))
                c.timeout = timeout
            except NbdError as e:
                on_fail(now, uri, str(e))
                i = (i + 1) % len(uris)
                continue
            if c.size < blocks * BLOCK:
                c.close(graceful=True)
                sys.exit(f"registers.py: {uri} has {c.size} bytes, fewer than --blocks {blocks} "
                         f"registers of {BLOCK}")
            return c, i
        time.sleep(max(0.0, min(0.1, deadline - time.monotonic())))


# ---------------------------------------------------------------------------------------------
# run


class Stopped(Exception):
    """SIGTERM."""


@dataclass
class Gaps:
    """Unavailability windows: from the invocation of the first failed operation (or connect
    attempt) to the completion of the next successful operation."""
    start: Optional[float] = None
    failures: int = 0
    done: list[dict] = field(default_factory=list)

    def failed(self, t: float) -> None:
        if self.start is None:
            self.start, self.failures = t, 0
        self.failures += 1

    def ok(self, t: float, t0: float) -> None:
        if self.start is not None:
            self.done.append({"at_s": round(self.start - t0, 6),
                              "seconds": round(t - self.start, 6), "failures": self.failures})
            self.start = None

    def close(self, t: float, t0: float) -> None:
        if self.start is not None:
            self.ok(t, t0)
            self.done[-1]["open"] = True


def split_uris(s: str) -> list[str]:
    uris = [u.strip() for u in s.split(",") if u.strip()]
    if not uris:
        raise argparse.ArgumentTypeError("no URI")
    return uris


def cmd_run(args: argparse.Namespace) -> int:
    need_nbd()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(8), "little")
    rng = random.Random(seed)
    uris: list[str] = args.uris
    counts = {"writes_ok": 0, "writes_info": 0, "reads_ok": 0, "reads_fail": 0, "corrupt": 0,
              "connects": 0}
    gaps = Gaps()

    def on_term(signum, frame):
        raise Stopped()

    signal.signal(signal.SIGTERM, on_term)
    log = open(args.log, "w")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec, separators=(",", ":")) + "\n")
        log.flush()

    def note(msg: str) -> None:
        print(f"registers[{args.writer}] +{time.monotonic() - t0:.3f}s {msg}", file=sys.stderr,
              flush=True)

    last_err: dict[str, str] = {}

    def conn_failed(t: float, uri: str, err: str) -> None:
        gaps.failed(t)
        last_err[uri] = err

    t0 = time.monotonic()
    end = t0 + args.seconds
    client: Optional[Client] = None
    idx = 0
    seq = 0
    stopped = None
    try:
        while time.monotonic() < end:
            if client is None:
                client, idx = connect_any(uris, idx, args.timeout, end, args.blocks, conn_failed)
                if client is None:
                    break
                counts["connects"] += 1
                note(f"connected to {client.uri}" +
                     (f" (last errors: {last_err})" if last_err else ""))
                last_err.clear()
            block = rng.randrange(args.blocks)
            is_read = rng.random() < args.read_fraction
            rec: dict = {"op": "read" if is_read else "write", "block": block, "value": None,
                         "invoke": None, "complete": None,
                         "outcome": "fail" if is_read else "info", "uri": client.uri,
                         "error": "interrupted"}
            try:
                if is_read:
                    rec["invoke"] = time.monotonic()
                    data = client.read(block * BLOCK, BLOCK)
                    t1 = time.monotonic()
                    value, bad = decode(block, data)
                    rec.update(value=list(value) if value else None, complete=t1, outcome="ok")
                    del rec["error"]
                    if bad is not None:
                        rec.update(corrupt=True, detail=bad)
                        counts["corrupt"] += 1
                        note(f"CORRUPT read of block {block}: {bad}")
                    counts["reads_ok"] += 1
                else:
                    seq += 1
                    data = encode(block, args.writer, seq)
                    rec["value"] = [args.writer, seq]
                    rec["invoke"] = time.monotonic()
                    client.write(data, block * BLOCK)
                    rec.update(complete=time.monotonic(), outcome="ok")
                    del rec["error"]
                    counts["writes_ok"] += 1
                gaps.ok(rec["complete"], t0)
            except NbdError as e:
                rec["error"] = str(e)
                counts["reads_fail" if is_read else "writes_info"] += 1
                gaps.failed(rec["invoke"])
                note(f"{rec['op']} of block {block} on {client.uri}: {e}; next URI")
                client.close()
                client = None
                idx += 1
            finally:
                if rec["invoke"] is not None:
                    if rec.get("error") == "interrupted":
                        counts["reads_fail" if is_read else "writes_info"] += 1
                    emit(rec)
    except (Stopped, KeyboardInterrupt) as e:
        stopped = "SIGTERM" if isinstance(e, Stopped) else "SIGINT"
    finally:
        if client is not None:
            client.close(graceful=stopped is None)
        log.close()
    gaps.close(time.monotonic(), t0)
    summary = {"writer": args.writer, "seed": seed, **counts,
               "longest_gap_s": max((g["seconds"] for g in gaps.done), default=0.0),
               "gaps": gaps.done}
    if stopped:
        summary["stopped_by"] = stopped
    print(json.dumps(summary), flush=True)
    return 1 if counts["corrupt"] else 0


# ---------------------------------------------------------------------------------------------
# check


def load_logs(paths: Iterable[str]) -> list[Op]:
    """Parses the logs; a truncated last line is ignored (with a warning), any other bad line is
    an error."""
    ops: list[Op] = []
    for path in paths:
        with open(path) as f:
            lines = f.readlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                v = r.get("value")
                op = Op(kind=r["op"], block=int(r["block"]),
                        value=(int(v[0]), int(v[1])) if v is not None else None,
                        invoke=float(r["invoke"]),
                        complete=INF if r.get("complete") is None else float(r["complete"]),
                        outcome=r["outcome"], corrupt=bool(r.get("corrupt", False)),
                        detail=r.get("detail", ""), source=f"{os.path.basename(path)}:{n}")
                if op.kind not in ("read", "write") or op.outcome not in ("ok", "fail", "info"):
                    raise ValueError("unknown op or outcome")
                if op.kind == "read" and op.outcome == "ok" and op.complete == INF:
                    raise ValueError("an ok read without completion")
            except (ValueError, KeyError, TypeError, IndexError) as e:
                if n == len(lines) and not line.endswith("\n"):
                    print(f"registers.py: {path}:{n}: ignoring a truncated last line",
                          file=sys.stderr)
                    continue
                raise SystemExit(f"registers.py: {path}:{n}: bad record ({e}): {line.strip()}")
            ops.append(op)
    return ops


def read_final_state(uris: list[str], blocks: int, timeout: float, budget: float = 60.0
                     ) -> dict[int, tuple[Optional[Value], Optional[str]]]:
    """Reads every block once, through the first URI that works, moving on to the next on any
    failure, for up to `budget` seconds in all."""
    deadline = time.monotonic() + budget
    final: dict[int, tuple[Optional[Value], Optional[str]]] = {}
    client: Optional[Client] = None
    idx = 0
    errors: list[str] = []
    b = 0
    while b < blocks and time.monotonic() < deadline:
        if client is None:
            client, idx = connect_any(uris, idx, timeout, deadline, blocks,
                                      lambda t, uri, err: errors.append(f"{uri}: {err}"))
            if client is None:
                break
        n = min(FINAL_CHUNK, blocks - b)
        try:
            data = client.read(b * BLOCK, n * BLOCK)
        except NbdError as e:
            errors.append(f"{client.uri}: {e}")
            client.close()
            client, idx = None, idx + 1
            continue
        for i in range(n):
            final[b + i] = decode(b + i, data[i * BLOCK:(i + 1) * BLOCK])
        b += n
    if client is not None:
        client.close(graceful=True)
    if errors:
        print(f"registers.py check: {len(errors)} failure(s) reading the final state, last: "
              f"{errors[-1]}", file=sys.stderr)
    return final


def report(violations: list[Violation], counts: Counts) -> dict:
    by_kind: dict[str, int] = defaultdict(int)
    for v in violations:
        by_kind[v.kind] += 1
    return {
        "ok": not violations,
        "ops_checked": counts.ops_checked,
        "counts": counts.__dict__,
        "checks": {
            "invented": {"checked": counts.values_checked, "violations": by_kind["invented"]},
            "lost_ack": {"checked": counts.lost_ack_checked, "violations": by_kind["lost_ack"]},
            "linearizability": {"checked": counts.lin_checked,
                                "violations": by_kind["linearizability"]},
            "duplicate_write": {"violations": by_kind["duplicate_write"]},
            "unavailable": {"violations": by_kind["unavailable"]},
        },
        "violations_total": len(violations),
        "violations": [v.to_json() for v in violations[:MAX_PRINTED]],
    }


def cmd_check(args: argparse.Namespace) -> int:
    global INFO_MAY_VANISH
    INFO_MAY_VANISH = not args.strict
    ops = load_logs(args.log)
    final = read_final_state(args.uris, args.blocks, args.timeout)
    violations, counts = check_history(ops, final, args.blocks)
    print(json.dumps(report(violations, counts), indent=2))
    return 1 if violations else 0


# ---------------------------------------------------------------------------------------------
# selftest


def _w(writer_seq: int, t0: float, t1: Optional[float], outcome: str = "ok") -> Op:
    return Op("write", 0, (1, writer_seq), t0, INF if t1 is None else t1, outcome)


def _r(value: Optional[int], t0: float, t1: float) -> Op:
    return Op("read", 0, None if value is None else (1, value), t0, t1, "ok")


def _final(value: Optional[int]) -> Op:
    return Op("read", 0, None if value is None else (1, value), 1000.0, 1001.0, "ok",
              source="final")


def _kinds(ops: list[Op], final: Optional[Op] = None) -> set[str]:
    return {v.kind for v in check_register(0, ops, final)}


def _crafted() -> list[str]:
    """Returns the names of the crafted cases that failed."""
    cases: list[tuple[str, list[Op], Optional[Op], set[str]]] = [
        ("clean sequential", [_w(1, 0, 1), _r(1, 2, 3), _w(2, 4, 5), _r(2, 6, 7)], _final(2),
         set()),
        ("zeros before the first write", [_r(None, 0, 1), _w(1, 2, 3), _r(1, 4, 5)], _final(1),
         set()),
        ("zeros read concurrently with the first write", [_w(1, 0, 5), _r(None, 1, 2),
                                                          _r(1, 3, 4)], _final(1), set()),
        ("stale read", [_w(1, 0, 1), _w(2, 2, 3), _r(1, 4, 5)], None, {"linearizability"}),
        ("zeros after an acknowledged write", [_w(1, 0, 1), _r(None, 2, 3)], None,
         {"linearizability"}),
        ("lost ack: final zeros", [_w(1, 0, 1)], _final(None), {"lost_ack", "linearizability"}),
        ("lost ack: final older value", [_w(1, 0, 1), _w(2, 2, 3)], _final(1),
         {"lost_ack", "linearizability"}),
        ("final value of a write concurrent with the last ack", [_w(1, 0, 5), _w(2, 1, 6)],
         _final(1), set()),
        ("value never written", [_w(1, 0, 1), _r(7, 2, 3)], None, {"invented"}),
        ("final value never written", [_w(1, 0, 1)], _final(7), {"invented"}),
        ("corrupt read", [Op("read", 0, None, 0, 1, "ok", corrupt=True, detail="x")], None,
         {"invented"}),
        ("read before its write", [_r(1, 0, 1), _w(1, 2, 3)], None, {"linearizability"}),
        ("reads against real time", [_w(1, 0, 1), _w(2, 2, 10), _r(2, 3, 4), _r(1, 5, 6)], None,
         {"linearizability"}),
        ("info write later observed", [_w(1, 0, 1), _w(2, 2, None, "info"), _r(2, 5, 6)],
         _final(2), set()),
        ("info write never observed", [_w(1, 0, 1), _w(2, 2, None, "info")], _final(1), set()),
        ("info write observed, then the older value", [_w(1, 0, 1), _w(2, 2, None, "info"),
                                                       _r(2, 3, 4), _r(1, 5, 6)], None,
         {"linearizability"}),
        ("info write from before an ack as the final value", [_w(2, 0, None, "info"),
                                                              _w(1, 1, 2)], _final(2), set()),
        ("concurrent writes read 2 then 1", [_w(1, 0, 5), _w(2, 1, 6), _r(2, 2, 3), _r(1, 7, 8)],
         _final(1), set()),
        ("concurrent writes read 1 then 2", [_w(1, 0, 5), _w(2, 1, 6), _r(1, 2, 3), _r(2, 7, 8)],
         _final(2), set()),
        ("concurrent writes, both orders seen", [_w(1, 0, 5), _w(2, 1, 6), _r(1, 7, 8),
                                                 _r(2, 9, 10), _r(1, 11, 12)], None,
         {"linearizability"}),
        ("read concurrent with the next write", [_w(1, 0, 1), _w(2, 2, 3), _r(1, 2.5, 4)], None,
         set()),
        ("backward zone inside a forward zone", [_w(1, 0, 1), _w(2, 2, 6), _r(2, 3, 5),
                                                 _r(1, 7, 8)], None, {"linearizability"}),
        ("duplicate value", [_w(1, 0, 1), _w(1, 2, 3)], None, {"duplicate_write"}),
    ]
    failed = []
    for name, ops, final, want in cases:
        got = _kinds(ops, final)
        ok_brute = brute_force_linearizable(ops + ([final] if final else []))
        if got != want or ok_brute != ("linearizability" not in want and "invented" not in want
                                        and "lost_ack" not in want):
            failed.append(name)
            print(f"selftest: {name}: violations {sorted(got)}, expected {sorted(want)}; "
                  f"exhaustive search says linearizable={ok_brute}", file=sys.stderr)
    return failed


def _random_history(rng: random.Random) -> list[Op]:
    """A history of at most 7 operations on one register, ties in time on purpose (small
    integers); half of them recorded from a simulated atomic register (so mostly valid), some
    with one read then altered, the rest with random read values."""
    n = rng.randint(1, 7)
    with_final = n > 1 and rng.random() < 0.3
    ops: list[Op] = []
    for i in range(n - with_final):
        t0 = rng.randint(0, 10)
        t1 = t0 + rng.randint(0, 4)
        if rng.random() < 0.45:
            info = rng.random() < 0.25
            ops.append(Op("write", 0, (1, i), t0, INF if info else t1, "info" if info else "ok"))
        else:
            ops.append(Op("read", 0, None, t0, t1, "ok"))
    if with_final:
        ops.append(Op("read", 0, None, 20, 21, "ok", source="final"))
    values = [o.value for o in ops if o.kind == "write"]
    reads = [o for o in ops if o.kind == "read"]
    if rng.random() < 0.5:
        points = []
        for o in ops:
            if o.kind == "write" and o.outcome == "info" and rng.random() < 0.4:
                continue  # never took effect
            points.append((rng.uniform(o.invoke, min(o.complete, 30.0)), rng.random(), o))
        cur = None
        for _, _, o in sorted(points, key=lambda p: p[:2]):
            if o.kind == "write":
                cur = o.value
            else:
                o.value = cur
        if reads and rng.random() < 0.3:
            rng.choice(reads).value = rng.choice(values + [None])
    else:
        for o in reads:
            x = rng.random()
            o.value = None if x < 0.25 or not values else (9, 9) if x < 0.28 else rng.choice(values)
    return ops


def _cross_check(rng: random.Random, runs: int) -> tuple[list[str], int]:
    failed: list[str] = []
    valid = 0
    for k in range(runs):
        ops = _random_history(rng)
        final = ops[-1] if ops[-1].source == "final" else None
        body = ops[:-1] if final else ops
        kinds = _kinds(body, final)
        poly = not kinds & {"invented", "linearizability"}
        brute = brute_force_linearizable(ops)
        valid += brute
        if poly != brute or ("lost_ack" in kinds and brute):
            failed.append(f"random history {k}")
            print(f"selftest: random history {k}: checker {sorted(kinds)}, exhaustive search "
                  f"says linearizable={brute}:\n  " + "\n  ".join(o.describe() for o in ops),
                  file=sys.stderr)
    return failed, valid


def _codec() -> list[str]:
    failed = []
    data = encode(5, 3, 77)
    if decode(5, data) != ((3, 77), None):
        failed.append("encode/decode round trip")
    if decode(5, ZERO) != (None, None):
        failed.append("zeros decode to None")
    if decode(6, data)[1] is None:
        failed.append("a register of another block is corrupt")
    for pos in (0, 10, 30, 100, 4095):
        bad = bytearray(data)
        bad[pos] ^= 1
        if decode(5, bytes(bad))[1] is None:
            failed.append(f"a flipped bit at byte {pos} is corrupt")
    if zlib.crc32(data[32:], zlib.crc32(data[:28])) != CRC.unpack_from(data, 28)[0]:
        failed.append("CRC covers bytes 0..28 and 32..4096")
    return failed


def _end_to_end() -> list[str]:
    """Logs written as `run` writes them, checked by check_history (final state given)."""
    recs = [
        {"op": "write", "block": 0, "value": [1, 1], "invoke": 1.0, "complete": 2.0,
         "outcome": "ok", "uri": "u"},
        {"op": "write", "block": 1, "value": [1, 2], "invoke": 3.0, "complete": None,
         "outcome": "info", "uri": "u", "error": "timeout"},
        {"op": "read", "block": 0, "value": [1, 1], "invoke": 4.0, "complete": 5.0,
         "outcome": "ok", "uri": "u"},
        {"op": "read", "block": 1, "value": None, "invoke": 6.0, "complete": None,
         "outcome": "fail", "uri": "u", "error": "timeout"},
    ]
    failed = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w1.log")
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs) + '{"op": "wri')
        ops = load_logs([path])
        good = {0: ((1, 1), None), 1: ((1, 2), None), 2: (None, None)}
        v, c = check_history(ops, good, 3)
        if v or c.writes_info_dropped != 0 or c.reads_fail != 1:
            failed.append(f"end to end, valid: {[x.to_json() for x in v]}")
        lost = dict(good)
        lost[0] = (None, None)
        v, _ = check_history(ops, lost, 3)
        if {x.kind for x in v} != {"lost_ack", "linearizability"}:
            failed.append("end to end, lost ack")
        v, _ = check_history(ops, {0: ((1, 1), None)}, 3)
        if {x.kind for x in v} != {"unavailable"}:
            failed.append("end to end, unavailable")
    return failed


def cmd_selftest(args: argparse.Namespace) -> int:
    t = time.monotonic()
    failed = _codec() + _crafted() + _end_to_end()
    rng = random.Random(args.seed)
    cross, valid = _cross_check(rng, args.runs)
    failed += cross
    if not (args.runs // 10 <= valid <= args.runs - args.runs // 10):
        failed.append(f"random histories too one-sided ({valid} of {args.runs} linearizable)")
    print(json.dumps({"ok": not failed, "failed": failed, "random_histories": args.runs,
                      "random_linearizable": valid, "seconds": round(time.monotonic() - t, 3)}))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="write and read registers, logging every operation")
    r.add_argument("--uris", type=split_uris, required=True, help="URI[,URI...]")
    r.add_argument("--blocks", type=int, required=True)
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--writer", type=int, required=True, help="this writer's id (unique, u32)")
    r.add_argument("--log", required=True)
    r.add_argument("--timeout", type=float, default=2.0, help="seconds per connect or operation")
    r.add_argument("--read-fraction", type=float, default=0.3)
    r.add_argument("--seed", type=int)

    c = sub.add_parser("check", help="read the final state and check the logs")
    c.add_argument("--log", action="extend", nargs="+", required=True)
    c.add_argument("--strict", action="store_true",
                   help="a never-acknowledged write that was read must stay (no block-device "
                        "semantics; see INFO_MAY_VANISH)")
    c.add_argument("--uris", type=split_uris, required=True, help="URI[,URI...]")
    c.add_argument("--blocks", type=int, required=True)
    c.add_argument("--timeout", type=float, default=2.0)

    s = sub.add_parser("selftest", help="test the checker")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--runs", type=int, default=300)

    args = p.parse_args(argv)
    if args.cmd == "run":
        if args.blocks <= 0 or args.timeout <= 0 or not 0 <= args.writer < 2**32:
            p.error("--blocks and --timeout must be positive, --writer a u32")
        return cmd_run(args)
    if args.cmd == "check":
        return cmd_check(args)
    return cmd_selftest(args)


if __name__ == "__main__":
    sys.exit(main())
