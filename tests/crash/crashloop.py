#!/usr/bin/python3
"""Real-process crash loop: `stria serve` on file drives, a verifying NBD client, SIGKILL at
random moments, many rounds on the same pool.

Every 4 KiB sector the client writes carries (magic, sector, sequence number, filler, CRC), so a
read identifies exactly which write it came from. The client keeps, per sector, the versions a
read may return after a crash: the last durable one (acknowledged FUA write, or a write that
completed before an acknowledged flush was sent) and every version written after it (in flight,
or acknowledged but not yet durable). After each restart every sector of the region is read
back and must be one of those versions: never an older one, never garbage, never an error.

A round: [start, maybe kill -9 during recovery and start again], verify, load for a random
0.5-4 s with up to 16 requests in flight (FUA and plain writes of 4-64 KiB, flushes, FUA
write-zeroes, never two in flight over the same sector), then SIGKILL while requests are in
flight; every other round also runs a clean cycle (start, verify, load, drain + flush, SIGTERM
with exit status 0).

Scenarios (--scenario): healthy, degraded (a drive failed before the first round), rebuilding
(each round fails a drive and replaces it, rebuild rate-limited so the kill lands mid-rebuild),
destaging (tiered and log layouts with a small cache so destage runs during the load), moving
(each round with no move pending adds a drive and `drive remove`s a member drive of the volume,
rate-limited, so the kill lands while its extent is copied and the next start resumes the move).

Usage: crashloop.py --stria PATH --layout ec:4+2 [--scenario healthy] [--rounds 5] [--seed S]
                    [--dir DIR] [--tmpfs] [--region-mib 128]
Exit status 0 when every round verified, 1 on the first violation (details on stderr).
"""

import argparse
import copy
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import nbd

SECTOR = 4096
MAGIC = b"STRIACRL"
HEAD = struct.Struct("<8sQQ")  # magic, sector, seq
FILL_WORDS = (SECTOR - HEAD.size - 8) // 8
ZERO = bytes(SECTOR)
MAX_INFLIGHT = 16
SEQ_PER_ROUND = 10_000_000


def sector_bytes(sector, seq):
    body = HEAD.pack(MAGIC, sector, seq) + struct.pack("<Q", seq ^ 0x9E3779B97F4A7C15) * FILL_WORDS
    body += b"\0\0\0\0"
    return body + struct.pack("<I", zlib.crc32(body))


def identify(block, sector):
    """Returns ('zero', None), ('data', seq), or ('garbage', description)."""
    if block == ZERO:
        return "zero", None
    magic, s, seq = HEAD.unpack_from(block)
    if magic != MAGIC or struct.unpack_from("<I", block, SECTOR - 4)[0] != zlib.crc32(block[:-4]):
        return "garbage", "no valid sector header/crc"
    if s != sector:
        return "garbage", f"sector {s}'s data (seq {seq}) at sector {sector}"
    return "data", seq


class Violation(Exception):
    pass


class Model:
    """Per sector: the list of versions a read may return, oldest first. A version is
    (seq, is_zero); the first is the durable baseline."""

    def __init__(self, sectors):
        self.versions = [[(0, True)] for _ in range(sectors)]
        self.unflushed = {}  # sector -> version completed (non-durable) since the last flush was sent
        self.completed = {}  # sector -> the newest version acknowledged since the last verify
        self.lost = 0  # sectors a verify read older than their newest acknowledged (not durable) version

    def issue(self, sectors, version):
        for s in sectors:
            self.versions[s].append(version)

    def complete(self, sectors, version, durable):
        for s in sectors:
            self.completed[s] = version
            if durable:
                self.versions[s] = [version]
                self.unflushed.pop(s, None)
            else:
                self.unflushed[s] = version

    def flush_sent(self):
        snap, self.unflushed = self.unflushed, {}
        return snap

    def flush_done(self, snap):
        for s, v in snap.items():
            lst = self.versions[s]
            if v in lst:
                self.versions[s] = lst[lst.index(v):]

    def check(self, sector, block):
        kind, seq = identify(block, sector)
        allowed = self.versions[sector]
        if kind == "zero" and any(z for _, z in allowed):
            self._count_lost(sector, next(v for v in reversed(allowed) if v[1]))
            return (0, True)
        if kind == "data":
            for v in allowed:
                if v == (seq, False):
                    self._count_lost(sector, v)
                    return v
        got = "zeros" if kind == "zero" else (f"seq {seq} (round {seq // SEQ_PER_ROUND})" if kind == "data" else seq)
        want = ", ".join("zeros" if z else f"seq {q}" for q, z in allowed)
        raise Violation(f"sector {sector}: read {got}; allowed: {want}")

    def _count_lost(self, sector, got):
        newest = self.completed.get(sector)
        allowed = self.versions[sector]
        if newest in allowed and allowed.index(got) < allowed.index(newest):
            self.lost += 1

    def settle(self, sector, version):
        self.versions[sector] = [version]
        self.completed.pop(sector, None)


class Daemon:
    def __init__(self, args, pool, sock):
        self.args, self.pool, self.sock = args, pool, sock
        self.proc = None
        self.log_path = os.path.join(os.path.dirname(pool), "serve.log")

    def cli(self, *cmd, check=True):
        r = subprocess.run([self.args.stria, *cmd, "--pool", self.pool], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"stria {' '.join(cmd)} failed: {r.stderr.strip()}")
        return r

    def start(self, wait=True):
        for p in (self.sock, os.path.join(self.pool, "stria.sock")):
            if os.path.exists(p):
                os.unlink(p)
        log = open(self.log_path, "a")
        extra = ["--rebuild-rate", self.args.rebuild_rate] if self.args.scenario == "rebuilding" else []
        self.proc = subprocess.Popen(
            [self.args.stria, "serve", "--pool", self.pool, "--nbd", f"unix:{self.sock}", "--log-level", "warn", *extra],
            stdout=log, stderr=log)
        log.close()
        if not wait:
            return
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stria serve exited with {self.proc.returncode}; see {self.log_path}")
            if os.path.exists(self.sock) and os.path.exists(os.path.join(self.pool, "stria.sock")):
                return
            time.sleep(0.01)
        raise RuntimeError("stria serve did not start in 60 s")

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()
        self.proc = None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=120)
        self.proc = None
        if rc != 0:
            raise RuntimeError(f"stria serve exited with {rc} after SIGTERM; see {self.log_path}")

    def uri(self, volume):
        return f"nbd+unix:///{volume}?socket={self.sock}"


def connect(daemon, volume):
    h = nbd.NBD()
    h.connect_uri(daemon.uri(volume))
    return h


def close(h):
    """Ends a connection (quietly if the server is gone)."""
    try:
        h.shutdown()
    except nbd.Error:
        pass
    del h


def region_digest(h, sectors, label):
    """CRC32 of each MiB of the region, as read through `h`."""
    chunk = 256
    out = []
    for first in range(0, sectors, chunk):
        n = min(chunk, sectors - first)
        try:
            out.append(zlib.crc32(h.pread(n * SECTOR, first * SECTOR)))
        except nbd.Error as e:
            raise Violation(f"{label}: read of sectors {first}..{first + n} failed: {e}")
    return out


def verify_snapshots(daemon, snaps, sectors, label, of="v"):
    """Every snapshot made of `of` (the volume, or a clone) reads back exactly as `of` did when
    it was made."""
    for name, digest in snaps:
        h = connect(daemon, f"{of}@{name}")
        got = region_digest(h, sectors, f"{label}: snapshot {name}")
        close(h)
        bad = [i for i, (a, b) in enumerate(zip(got, digest)) if a != b]
        if bad:
            raise Violation(f"{label}: snapshot {name} differs from the volume when it was made in MiB {bad[:8]}")


def verify(h, model, sectors, label):
    """Reads every sector and checks it; the observed versions become the new baselines."""
    chunk = 256  # sectors per read (1 MiB)
    for first in range(0, sectors, chunk):
        n = min(chunk, sectors - first)
        try:
            buf = h.pread(n * SECTOR, first * SECTOR)
        except nbd.Error as e:
            raise Violation(f"{label}: read of sectors {first}..{first + n} failed: {e}")
        for i in range(n):
            s = first + i
            v = model.check(s, buf[i * SECTOR:(i + 1) * SECTOR])
            model.settle(s, v)


class Load:
    """Random FUA/plain writes, flushes and FUA write-zeroes, up to MAX_INFLIGHT in flight,
    never two in flight over one sector."""

    def __init__(self, h, model, sectors, rng, seq_base, fua_only):
        self.h, self.model, self.sectors, self.rng = h, model, sectors, rng
        self.fua_only = fua_only
        self.seq = seq_base
        self.busy = set()
        self.ops = {}  # cookie -> (kind, sectors, version, snapshot)
        self.acked = 0

    def _free_range(self, blocks):
        for _ in range(8):
            first = self.rng.randrange(0, self.sectors - blocks + 1)
            rng_ = range(first, first + blocks)
            if not any(s in self.busy for s in rng_):
                return rng_
        return None

    def submit_one(self):
        r = self.rng.uniform(0.10, 0.70) if self.fua_only else self.rng.random()
        if r < 0.04:
            snap = self.model.flush_sent()
            c = self.h.aio_flush()
            self.ops[c] = ("flush", (), None, snap)
            return
        blocks = self.rng.randint(1, 16) if self.fua_only else self.rng.choice((1, 1, 2, 4, 8, 16))
        secs = self._free_range(blocks)
        if secs is None:
            return
        self.seq += 1
        if r < 0.10:
            version = (self.seq, True)
            c = self.h.aio_zero(blocks * SECTOR, secs.start * SECTOR, flags=nbd.CMD_FLAG_FUA)
            kind = "zero-fua"
        else:
            version = (self.seq, False)
            data = b"".join(sector_bytes(s, self.seq) for s in secs)
            fua = r < 0.70
            c = self.h.aio_pwrite(data, secs.start * SECTOR, flags=nbd.CMD_FLAG_FUA if fua else 0)
            kind = "write-fua" if fua else "write"
        self.model.issue(secs, version)
        self.busy.update(secs)
        self.ops[c] = (kind, secs, version, None)

    def fill(self):
        for _ in range(4 * MAX_INFLIGHT):
            if len(self.ops) >= MAX_INFLIGHT:
                return
            self.submit_one()

    def reap(self):
        while self.ops:
            c = self.h.aio_peek_command_completed()
            if c <= 0:
                return
            kind, secs, version, snap = self.ops.pop(c)
            try:
                self.h.aio_command_completed(c)
            except nbd.Error as e:
                raise Violation(f"{kind} failed while the server was up: {e}")
            self.acked += 1
            if kind == "flush":
                self.model.flush_done(snap)
            else:
                self.model.complete(secs, version, durable=kind != "write")
                self.busy.difference_update(secs)

    def run_until(self, stop):
        """Runs until `stop` (a threading.Event) is set, from another thread that then kills the
        server: requests left in flight stay unacknowledged (the model allows them either way)."""
        while not stop.is_set():
            try:
                self.fill()
                if self.ops:
                    self.h.poll(100)
                    self.reap()
            except (nbd.Error, Violation):
                if stop.wait(5):
                    return  # the server was killed under it
                raise

    def run(self, seconds, kill=None):
        """Runs for `seconds`; then calls `kill` with requests in flight (crash) or drains and
        flushes (clean end)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.fill()
            if self.ops:
                self.h.poll(-1)
                self.reap()
        if kill is not None:
            self.fill()
            kill()
            return len(self.ops)
        while self.ops:
            self.h.poll(-1)
            self.reap()
        snap = self.model.flush_sent()
        self.h.flush()
        self.model.flush_done(snap)
        return 0


def pick_drive(daemon, volume, rng):
    """A drive that holds part of the volume (for tiered volumes: a capacity or fast one)."""
    show = json.loads(daemon.cli("volume", "show", volume, "--json").stdout)
    parts = [json.loads(daemon.cli("volume", "show", p["volume"], "--json").stdout) for p in show["parts"]] \
        if "parts" in show else [show]
    slots = set()
    for part in parts:
        for seg in part["segments"]:
            for m in seg["members"]:
                if m["rebuild_cursor_rows"] is None:
                    slots.add(m["drive"])
    return rng.choice(sorted(slots))


def start_move(daemon, volume, rng, tag, rnd, drive_size):
    """Unless a drive is still draining: adds a capacity drive and removes a member drive of the
    volume, so that its extent moves (in the daemon, rate-limited) during this round's load."""
    status = json.loads(daemon.cli("status", "--json", check=False).stdout)
    drives = status["drives"]
    if any(d.get("draining") for d in drives):
        moving = (status.get("rebalance") or {}).get("current")
        print(f"{tag} round {rnd}: a drive is still draining ({moving})", flush=True)
        return
    daemon.cli("drive", "add", "--class", "capacity", "--size", drive_size)
    capacity = {d["id"] for d in drives if d["class"] == "capacity"}
    slot = None
    while slot not in capacity:  # a tiered volume's fast drives have no spare to move to
        slot = pick_drive(daemon, volume, rng)
    # At 4 MB/s a 16 MiB extent takes 4 s, so the move commits its cursor (every 2 s) and the
    # kill often lands after that: the next start resumes it there.
    rate = rng.choice(["4M", "48M"])
    daemon.cli("drive", "remove", str(slot), "--rate", rate)
    print(f"{tag} round {rnd}: drive added, drive {slot} draining at {rate}/s", flush=True)


def moves_recopied(daemon):
    """Restarts whose recovery copied rows of a move cut short again, and how many rows."""
    try:
        with open(daemon.log_path) as f:
            found = [int(m) for m in re.findall(r"move_rows_recopied: (\d+)", f.read())]
    except OSError:
        return 0, 0
    return sum(1 for n in found if n > 0), sum(found)


def scrub_clean(daemon, volume, label):
    """After recovery every stripe must be consistent: a scrub finds nothing to fix."""
    r = daemon.cli("scrub", volume, "--json", check=False)
    if r.returncode != 0:
        raise Violation(f"{label}: scrub failed: {r.stderr.strip()} {r.stdout.strip()}")
    report = json.loads(r.stdout)
    bad = {k: report[k] for k in ("blocks_repaired", "parity_blocks_fixed", "copy_blocks_fixed",
                                  "unrecoverable_blocks", "inconsistent_blocks") if report.get(k)}
    if bad:
        raise Violation(f"{label}: scrub found inconsistent stripes after recovery: {bad}")


def volume_size(daemon, volume):
    return json.loads(daemon.cli("volume", "show", volume, "--json").stdout)["size_bytes"]


def volume_state(daemon, volume):
    return json.loads(daemon.cli("volume", "show", volume, "--json").stdout)["state"]


def wait_state(daemon, volume, want, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        show = json.loads(daemon.cli("volume", "show", volume, "--json").stdout)
        if show["state"] == want:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{volume} did not become {want}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stria", required=True)
    ap.add_argument("--layout", required=True)
    ap.add_argument("--scenario", default="healthy", choices=["healthy", "degraded", "rebuilding", "destaging", "moving"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", default=None, help="work directory (default: a new one under /var/tmp, or /dev/shm with --tmpfs)")
    ap.add_argument("--tmpfs", action="store_true", help="drive files on tmpfs (the inline I/O engine)")
    ap.add_argument("--region-mib", type=int, default=128)
    ap.add_argument("--volume-mib", type=int, default=512)
    ap.add_argument("--rebuild-rate", default="16M")
    ap.add_argument("--mix", default="both", choices=["both", "mixed", "fua"],
                    help="mixed: FUA and plain writes, flushes, FUA write-zeroes; fua: FUA writes of 4-64 KiB "
                         "only (the outside checker's load); both: drawn per round")
    ap.add_argument("--scrub-every", type=int, default=10,
                    help="scrub the volume after the post-kill verification every N rounds (and the last)")
    ap.add_argument("--drive-size", default="1G")
    ap.add_argument("--snapshots", type=int, default=0,
                    help="tiered/log layouts: make a snapshot at the start of each of the first N rounds; "
                         "after every restart each must read exactly as the volume did when it was made")
    ap.add_argument("--delete-snapshots", action="store_true",
                    help="in rounds with two snapshots or more, delete one while the load runs (the kill -9 may "
                         "land in the delete): once the command returned it is gone, else it is gone or intact; "
                         "new snapshots are made whenever fewer than --snapshots are left")
    ap.add_argument("--clones", action="store_true",
                    help="with --snapshots: clone each new snapshot when no clone lives and write to the clone "
                         "beside the volume (its own model, checked after every restart); in some rounds delete "
                         "the clone while the volume's load runs (the kill -9 may land in the delete); at the end, "
                         "if a clone lives, delete the volume (kept, hidden, for its clone) while the clone's load "
                         "runs, with a kill -9 before, in or after the delete")
    ap.add_argument("--clone-snapshots", type=int, default=0,
                    help="with --clones: at the start of a round in which the clone is written, snapshot it "
                         "while fewer than N of its snapshots live; in some rounds delete one of them while the "
                         "clone's load runs (handed up into the clone; the kill -9 may land in the delete); after "
                         "every restart each must read exactly as the clone did when it was made, and the clone "
                         "as its own model")
    ap.add_argument("--resize", action="store_true",
                    help="grow the volume by 8 MiB in every round while the load runs (the kill -9 may land in "
                         "the resize): after the restart its size is the old one or the new one, the new one if "
                         "the command returned, and every snapshot keeps its size; with --clones a live clone "
                         "then grows 4 MiB past the new size (old or new size after the restart, zeros in what it gained; "
                         "the volume keeps its own size)")
    ap.add_argument("--cache-mode", choices=["write-through", "write-back"], default=None,
                    help="tiered/log layouts: `volume create --cache-mode` (write-back: plain writes are "
                         "acknowledged before they are durable; the model allows them to be lost until a "
                         "flush covers them, as it does on every layout)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    base = args.dir or tempfile.mkdtemp(prefix="stria-crash.", dir="/dev/shm" if args.tmpfs else "/var/tmp")
    os.makedirs(base, exist_ok=True)
    pool = os.path.join(base, "pool")
    sock = os.path.join(base, "nbd.sock")
    tag = f"[{args.layout} {args.scenario}{' tmpfs' if args.tmpfs else ''} seed={seed}]"
    print(f"{tag} work directory {base}", flush=True)
    daemon = Daemon(args, pool, sock)
    ok = False
    try:
        run(args, rng, daemon, tag)
        ok = True
    except Violation as e:
        print(f"{tag} VIOLATION: {e}", file=sys.stderr, flush=True)
        if "ENOSPC" in str(e):
            describe_space(daemon, tag)
    except Exception as e:  # noqa: BLE001 - report anything as a failure of the loop
        print(f"{tag} ERROR: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        daemon.kill9()
        if not ok:
            try:
                with open(daemon.log_path) as f:
                    tail = f.readlines()[-30:]
                print("".join(tail), file=sys.stderr)
            except OSError:
                pass
        if (ok and not args.keep) and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
        elif not ok:
            print(f"{tag} kept {base} for inspection", file=sys.stderr)
    sys.exit(0 if ok else 1)


def describe_space(daemon, tag):
    """After an ENOSPC: what holds the space (the scenario sizes --space for its worst case, so
    this is stria's accounting or GC failing, not the test outgrowing the volume)."""
    try:
        status = daemon.cli("status", check=False).stdout
        listed = daemon.cli("snapshot", "list", check=False).stdout
    except OSError:
        return
    for line in [l for l in status.splitlines() if l.startswith("thin space")] + listed.splitlines():
        print(f"{tag} {line}", file=sys.stderr, flush=True)


def run(args, rng, daemon, tag):
    vol = "v"
    sectors = args.region_mib * (1 << 20) // SECTOR
    daemon.cli("pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", args.drive_size)
    create = ["volume", "create", vol, "--size", f"{args.volume_mib}M", "--layout", args.layout]
    if args.layout.startswith(("tiered", "log")):
        create += ["--cache-size", "32M" if args.scenario == "destaging" else "64M"]
        # Each image the scenario keeps may hold a whole region of its own: the volume, its
        # snapshots, and with --clones the clone, the snapshot it was made from (kept for it once
        # deleted) and the clone's snapshots. The default space (1.5 x --size) is smaller than
        # that when many live at once, and then writes rightly get ENOSPC; give the worst case a
        # quarter more for garbage and the two segments GC keeps.
        images = 1 + args.snapshots + (2 + args.clone_snapshots if args.clones else 0)
        space_mib = max(args.volume_mib * 3 // 2, images * args.region_mib * 5 // 4 + 64)
        create += ["--space", f"{space_mib}M"]
        if args.cache_mode:
            create += ["--cache-mode", args.cache_mode]
    daemon.cli(*create)
    model = Model(sectors)
    size = args.volume_mib << 20  # what the volume holds now (--resize grows it)
    snap_sizes = {}  # snapshot name -> the volume's size when it was made
    snaps = []  # (name, CRC32 per MiB of the region when it was made)
    clone = None  # {"name", "model"} of the live clone (--clones)
    if args.scenario == "degraded":
        daemon.start()
        slot = pick_drive(daemon, vol, rng)
        daemon.cli("drive", "fail", str(slot))
        print(f"{tag} drive {slot} failed", flush=True)
        daemon.stop()
    started = time.time()
    for rnd in range(1, args.rounds + 1):
        seq_base = rnd * SEQ_PER_ROUND
        # Crash round.
        if rnd > 1 and rng.random() < 0.3:
            daemon.start(wait=False)
            time.sleep(rng.uniform(0, 0.3))
            daemon.kill9()
        daemon.start()
        h = connect(daemon, vol)
        verify(h, model, sectors, f"round {rnd} start")
        verify_snapshots(daemon, snaps, sectors, f"round {rnd} start")
        if rnd <= args.snapshots or (args.delete_snapshots and len(snaps) < args.snapshots):
            # No write is in flight: the snapshot is the volume as it reads now.
            digest = region_digest(h, sectors, f"round {rnd} before snapshot")
            daemon.cli("snapshot", "create", vol, f"r{rnd}")
            snaps.append((f"r{rnd}", digest))
            snap_sizes[f"r{rnd}"] = size
            if args.clones and clone is None:
                # The clone reads as the snapshot, which is the volume as `verify` just settled it.
                daemon.cli("volume", "clone", f"{vol}@r{rnd}", f"k{rnd}")
                clone = {"name": f"k{rnd}", "model": copy.deepcopy(model), "size": size, "snaps": []}
                print(f"{tag} round {rnd}: clone k{rnd} of {vol}@r{rnd}", flush=True)
        if args.scenario == "rebuilding" and volume_state(daemon, vol) == "healthy":
            # A new failure only once the last rebuild finished: the kill lands during the
            # rebuild (rate-limited), and the next rounds land in its resumption.
            slot = pick_drive(daemon, vol, rng)
            daemon.cli("drive", "fail", str(slot))
            daemon.cli("drive", "replace", str(slot))
        if args.scenario == "moving":
            start_move(daemon, vol, rng, tag, rnd, args.drive_size)
        fua = args.mix == "fua" or (args.mix == "both" and rng.random() < 0.5)
        deleting = None
        if args.delete_snapshots and len(snaps) >= 2 and rng.random() < 0.5:
            name = rng.choice(snaps)[0]
            result = {}

            def delete(name=name, result=result):
                r = daemon.cli("snapshot", "delete", vol, name, check=False)
                result["ok"] = r.returncode == 0

            deleting = (name, threading.Thread(target=delete), result)
            time.sleep(rng.uniform(0, 0.5))
            deleting[1].start()
        # The clone: deleted in some rounds (while the volume's load runs), else written beside it.
        clone_thread, clone_stop, clone_errors, clone_delete = None, threading.Event(), [], {}
        cdeleting = None
        cload = None
        if clone is not None and rng.random() < 0.25:
            def delete_clone(name=clone["name"], result=clone_delete):
                r = daemon.cli("volume", "delete", name, "--with-snapshots", check=False)
                result["ok"] = r.returncode == 0

            clone_delete["thread"] = threading.Thread(target=delete_clone)
            clone_delete["thread"].start()
        elif clone is not None:
            hc = connect(daemon, clone["name"])
            verify(hc, clone["model"], sectors, f"round {rnd} start: clone {clone['name']}")
            if len(clone["snaps"]) < args.clone_snapshots:
                # No write to the clone is in flight: its snapshot is the clone as it reads now.
                digest = region_digest(hc, sectors, f"round {rnd} before a snapshot of the clone")
                daemon.cli("snapshot", "create", clone["name"], f"c{rnd}")
                clone["snaps"].append((f"c{rnd}", digest))
            if len(clone["snaps"]) >= 2 and rng.random() < 0.5:
                cname = rng.choice(clone["snaps"])[0]
                cresult = {}

                def delete_clone_snapshot(name=cname, result=cresult, of=clone["name"], after=rng.uniform(0, 0.5)):
                    time.sleep(after)
                    r = daemon.cli("snapshot", "delete", of, name, check=False)
                    result["ok"] = r.returncode == 0

                cdeleting = (cname, threading.Thread(target=delete_clone_snapshot), cresult)
                cdeleting[1].start()
            cload = Load(hc, clone["model"], sectors, random.Random(rng.random()), seq_base + SEQ_PER_ROUND // 4, fua)

            def write_clone(cload=cload, hc=hc):
                try:
                    cload.run_until(clone_stop)
                except Exception as e:  # noqa: BLE001 - reported by the main thread
                    clone_errors.append(e)
                close(hc)

            clone_thread = threading.Thread(target=write_clone)
            clone_thread.start()

        # The growth (--resize): in a thread, started while the load runs; the kill may cut it.
        # With a clone (--clones) not being deleted, the clone then grows 4 MiB past the volume's
        # new size (the family's map grows for it) while its load runs: the blocks it gains must
        # read as zeros after the restart, and the volume keeps its own size.
        resizing = None
        if args.resize:
            grow = {"to": size + (8 << 20), "after": rng.uniform(0, 1.0)}
            if clone is not None and not clone_delete:
                # Past the volume's new size: the family's map grows for it, the volume keeps its.
                grow["clone"], grow["clone_to"] = clone["name"], grow["to"] + (4 << 20)

            def resize(grow=grow):
                time.sleep(grow["after"])
                r = daemon.cli("volume", "resize", vol, "--size", str(grow["to"]), check=False)
                grow["ok"] = r.returncode == 0
                if grow["ok"] and "clone" in grow:
                    grow["clone_began"] = True
                    r = daemon.cli("volume", "resize", grow["clone"], "--size", str(grow["clone_to"]), check=False)
                    grow["clone_ok"] = r.returncode == 0

            resizing = (threading.Thread(target=resize), grow)
            resizing[0].start()

        def kill():
            clone_stop.set()
            daemon.kill9()

        load = Load(h, model, sectors, rng, seq_base, fua)
        inflight = load.run(rng.uniform(2, 5) if fua else rng.uniform(0.5, 4.0), kill=kill)
        close(h)
        acked = load.acked
        if deleting:
            deleting[1].join()
        if resizing:
            resizing[0].join()
        if clone_thread:
            clone_thread.join()
            if clone_errors:
                raise Violation(f"round {rnd}: the clone's load: {clone_errors[0]}")
        if clone_delete:
            clone_delete["thread"].join()
        if cdeleting:
            cdeleting[1].join()
        # Restart and verify the crash; then maybe a clean cycle on top.
        daemon.start()
        h = connect(daemon, vol)
        lost_before = model.lost
        verify(h, model, sectors, f"round {rnd} after kill -9")
        lost = model.lost - lost_before
        if resizing:
            grow = resizing[1]
            now = volume_size(daemon, vol)
            if now not in (size, grow["to"]) or (grow.get("ok") and now != grow["to"]):
                raise Violation(f"round {rnd}: the volume holds {now} bytes after a resize from {size} to "
                                f"{grow['to']} that {'returned' if grow.get('ok') else 'the kill cut'}")
            print(f"{tag} round {rnd}: resize to {grow['to'] >> 20} MiB "
                  f"{'returned' if grow.get('ok') else 'cut by the kill'}, size {now >> 20} MiB", flush=True)
            size = now
        if deleting:
            name, _, result = deleting
            listed = [s["name"] for s in json.loads(daemon.cli("snapshot", "list", vol, "--json").stdout)]
            if result.get("ok") and name in listed:
                raise Violation(f"round {rnd}: snapshot {name} is listed after its delete returned")
            print(f"{tag} round {rnd}: delete of {name} {'returned' if result.get('ok') else 'cut by the kill'}, "
                  f"{'gone' if name not in listed else 'still there'}", flush=True)
            if name not in listed:
                snaps = [s for s in snaps if s[0] != name]
        verify_snapshots(daemon, snaps, sectors, f"round {rnd} after kill -9")
        if resizing:
            for name, _ in snaps:
                snap_size = int(subprocess.run(["nbdinfo", "--size", daemon.uri(f"{vol}@{name}")],
                                               check=True, capture_output=True, text=True).stdout)
                if snap_size != snap_sizes[name]:
                    raise Violation(f"round {rnd}: snapshot {name} exports {snap_size} bytes, was made at "
                                    f"{snap_sizes[name]} (the volume holds {size} now)")
        if clone is not None:
            listed = [v["name"] for v in json.loads(daemon.cli("status", "--json", check=False).stdout).get("clones", [])]
            there = clone["name"] in listed
            if clone_delete:
                if clone_delete.get("ok") and there:
                    raise Violation(f"round {rnd}: clone {clone['name']} is there after its delete returned")
                print(f"{tag} round {rnd}: delete of clone {clone['name']} "
                      f"{'returned' if clone_delete.get('ok') else 'cut by the kill'}, "
                      f"{'still there' if there else 'gone'}", flush=True)
            elif not there:
                raise Violation(f"round {rnd}: clone {clone['name']} is gone after a kill -9")
            if there and cdeleting:
                name, _, result = cdeleting
                listed = [s["name"] for s in json.loads(daemon.cli("snapshot", "list", clone["name"], "--json").stdout)]
                if result.get("ok") and name in listed:
                    raise Violation(f"round {rnd}: snapshot {name} of the clone is listed after its delete returned")
                print(f"{tag} round {rnd}: delete of {clone['name']}@{name} "
                      f"{'returned' if result.get('ok') else 'cut by the kill'}, "
                      f"{'gone' if name not in listed else 'still there'}", flush=True)
                if name not in listed:
                    clone["snaps"] = [s for s in clone["snaps"] if s[0] != name]
            if there:
                verify_snapshots(daemon, clone["snaps"], sectors, f"round {rnd} after kill -9", of=clone["name"])
                hc = connect(daemon, clone["name"])
                verify(hc, clone["model"], sectors, f"round {rnd} after kill -9: clone {clone['name']}")
                if resizing and "clone" in resizing[1]:
                    check_clone_growth(daemon, hc, clone, resizing[1], tag, rnd)
                close(hc)
            else:
                clone = None
        if rnd % args.scrub_every == 0 or rnd == args.rounds:
            scrub_clean(daemon, vol, f"round {rnd} after kill -9")
        if rnd % 2 == 0:
            load = Load(h, model, sectors, rng, seq_base + SEQ_PER_ROUND // 2, fua)
            load.run(rng.uniform(0.3, 1.0))
            close(h)
            daemon.stop()
            daemon.start()
            h = connect(daemon, vol)
            verify(h, model, sectors, f"round {rnd} after clean stop")
        close(h)
        daemon.stop()
        resumed = ""
        if args.scenario == "moving":
            restarts, rows = moves_recopied(daemon)
            resumed = f", {restarts} restarts recopied {rows} rows of a cut move"
        print(f"{tag} round {rnd}/{args.rounds} ok ({'fua' if fua else 'mixed'}): {acked} acknowledged, "
              f"{inflight} in flight at the kill, {lost} sectors read older than acknowledged (not durable; "
              f"{model.lost} in all rounds)"
              f"{f', {cload.acked} acknowledged by the clone' if cload else ''}{resumed} "
              f"({time.time() - started:.0f} s)", flush=True)
    if clone is not None:
        delete_origin(args, rng, daemon, tag, vol, model, snaps, sectors, clone)


def check_clone_growth(daemon, hc, clone, grow, tag, rnd):
    """After a restart: the clone holds its old size or (if its growth began) the new one, the new
    one if the growth returned, and the bytes it gained (past every load's region) read as zeros."""
    now = volume_size(daemon, clone["name"])
    to = grow["clone_to"]
    allowed = {clone["size"]} | ({to} if grow.get("clone_began") else set())
    if now not in allowed or (grow.get("clone_ok") and now != to):
        raise Violation(f"round {rnd}: clone {clone['name']} holds {now} bytes after a growth from {clone['size']} "
                        f"to {to} that {'returned' if grow.get('clone_ok') else 'did not return'}")
    for at in range(clone["size"], now, 1 << 20):
        n = min(1 << 20, now - at)
        if hc.pread(n, at) != bytes(n):
            raise Violation(f"round {rnd}: clone {clone['name']} grown from {clone['size']} reads data at {at}")
    if grow.get("clone_began"):
        print(f"{tag} round {rnd}: clone {clone['name']} growth to {to >> 20} MiB (past the volume) "
              f"{'returned' if grow.get('clone_ok') else 'cut by the kill'}, size {now >> 20} MiB", flush=True)
    clone["size"] = now


def listed_volume(daemon, name):
    """The `volume list --json` entry of `name`, or None."""
    entries = json.loads(daemon.cli("volume", "list", "--json").stdout)
    return next((e for e in entries if e["name"] == name), None)


def delete_origin(args, rng, daemon, tag, vol, model, snaps, sectors, clone):
    """Last (--clones, a clone living): the origin's delete while the clone's load runs, the kill -9
    landing before, in or after it. After the restart the origin is deleted (kept, hidden, for the
    clone: not exported, no snapshot listed) if the command returned, else deleted or whole; the
    clone reads as its model either way; the clone's delete then takes the origin's parts."""
    daemon.start()
    hc = connect(daemon, clone["name"])
    verify(hc, clone["model"], sectors, f"origin delete: clone {clone['name']} before")
    cload = Load(hc, clone["model"], sectors, random.Random(rng.random()), (args.rounds + 1) * SEQ_PER_ROUND, True)
    result, delay = {}, rng.uniform(0, 0.6)

    def delete():
        time.sleep(delay)
        r = daemon.cli("volume", "delete", vol, "--with-snapshots", check=False)
        result["ok"] = r.returncode == 0

    thread = threading.Thread(target=delete)
    thread.start()
    inflight = cload.run(rng.uniform(0.2, 1.2), kill=daemon.kill9)
    close(hc)
    thread.join()
    daemon.start()
    entry = listed_volume(daemon, vol)
    deleted = entry is not None and entry["kind"] == "deleted"
    if result.get("ok") and not deleted:
        raise Violation(f"the origin's delete returned and {vol} is listed as {entry}")
    if deleted:
        if [s for s in json.loads(daemon.cli("snapshot", "list", "--json").stdout) if s["volume"] == vol]:
            raise Violation("the origin is deleted and its snapshots are listed")
        if subprocess.run(["nbdinfo", "--size", daemon.uri(vol)], capture_output=True).returncode == 0:
            raise Violation("the origin is deleted and still exported")
    else:
        h = connect(daemon, vol)
        verify(h, model, sectors, "origin delete cut before its mark: the volume")
        close(h)
        verify_snapshots(daemon, snaps, sectors, "origin delete cut before its mark")
    hc = connect(daemon, clone["name"])
    verify(hc, clone["model"], sectors, f"origin delete: clone {clone['name']} after kill -9")
    close(hc)
    print(f"{tag} origin delete {'returned' if result.get('ok') else 'cut by the kill'}: "
          f"{vol} {'kept for its clone' if deleted else 'whole'}; {cload.acked} clone writes acknowledged, "
          f"{inflight} in flight at the kill; the clone reads back", flush=True)
    daemon.cli("volume", "delete", clone["name"], "--with-snapshots")
    if not deleted:
        daemon.cli("volume", "delete", vol, "--with-snapshots")
    if listed_volume(daemon, vol) is not None:
        raise Violation(f"{vol} is listed after its last clone's delete")
    daemon.stop()


if __name__ == "__main__":
    main()
