#!/usr/bin/env python3
"""A model of a log-structured volume's write cache and segment GC, for choosing a GC policy
before building one (issue 39: "GC that knows temperature"). Not stria: a few hundred lines
of stria's log (docs/design/log-structured-volumes.md) reduced to what decides the bytes GC
moves. Blocks are 1 unit; the write cache is a FIFO in which a rewrite of a cached block replaces
it (the ring); destage takes the oldest cached block into a stream's open segment; segments hold
`--segment` blocks; GC runs when fewer than 3 segments are free and moves a victim's live blocks
into a GC stream. Printed: destaged and GC-moved blocks per host write in the measured phase
(one volume's worth of writes after a sequential fill and `--warm` volumes' worth); stria's
capacity bytes per host byte are about 1.5x the total for ec:4+2.

Streams (`--modes`):
  base    one host stream, one GC stream (what stria does)
  sep     host writes split hot/cold by the rewrite interval of the version they replace
          (shorter than the running mean: hot), one GC stream
  chain   as sep, and GC survivors go one generation older (hot -> g1, cold/g1 -> g2, g2 -> g3)
  oracle  as chain, hot/cold told by the workload's true hot set (80/20 only)
  split   hot and cold classes, each with a host and a GC stream (GC survivors stay in their
          victim's class, `--hot-survivors gcold` sends a hot victim's to the cold one); host
          writes hot when the interval is under `--thresh` times the running mean
  split2  as split, hot only if the version replaced lay in a hot segment too or the interval
          was under a quarter of that (what stria builds: GcPolicy::Temperature, log/heat.rs)
  split-oracle  as split, hot/cold told by the true hot set (80/20 only)
  split-freq    as split, hot when a per-block estimate of the rewrite interval (half the last
          interval, half the estimate before) is under `--thresh` times the running mean: a
          frequency per block instead of split2's two intervals (tried, not built)
`--keep F`: a block the destage would take that is hot (interval under `--thresh` times the
mean) goes round the cache once more instead (a fast-tier write, printed as re-cached), while
such blocks are under F of the cache: whether keeping hot blocks in the cache longer would save
capacity writes (docs/design/log-structured-volumes.md, "GC that knows temperature").
`--laps N`: how many laps a kept block may go round before it must be destaged (default 1).
`--mean destaged`: the running mean the temperature rules compare intervals with is of the
blocks destaged only (default `host`: of every host write, what stria does).
Victims (`--policies`): greedy (fewest live blocks), cost-benefit (LFS's (1-u)*age/(1+u), age of a
segment = host writes since the newest block it holds was written; `--age opened`: since the
segment was opened, what stria counted before 2026-12-04); with the split modes also
split (GC takes from the class holding more than its share of the split of the space that
minimises the modelled cost of both, greedy within it) and split-cb (the same, cost-benefit
within it).

Usage: scripts/gc-model.py --workload 80/20 --fill 0.8 --modes base,chain --policies greedy,cost-benefit
(64 Ki blocks: about a minute per run on one core).
"""
import argparse
import bisect
import math
import random
from collections import OrderedDict


def picker(workload, n, rng):
    """Draws block numbers: uniform, 80/20 (80 % of writes to a scattered 20 %), or Zipf 1.1."""
    perm = list(range(n))
    rng.shuffle(perm)
    hot = set(perm[: n // 5])
    if workload == "uniform":
        return (lambda: rng.randrange(n)), hot
    if workload == "80/20":
        h = n // 5
        return (lambda: perm[rng.randrange(h)] if rng.random() < 0.8 else perm[h + rng.randrange(n - h)]), hot
    cdf, acc = [], 0.0
    for r in range(1, n + 1):
        acc += r ** -1.1
        cdf.append(acc)
    cdf = [c / acc for c in cdf]
    return (lambda: perm[min(bisect.bisect_left(cdf, rng.random()), n - 1)]), hot


def cost_of(u):
    """GC moves per write of greedy GC under uniform writes at utilisation u."""
    lo, hi = 1e-9, 1 - 1e-9
    for _ in range(60):
        x = (lo + hi) / 2
        if (1 - x) / -math.log(x) < u:
            lo = x
        else:
            hi = x
    return x / (1 - x)


COSTS = [cost_of(i / 1000) if i else 0.0 for i in range(1000)]


def best_split(dh, dc, rh, total):
    """Slots of the hot class that minimise rh*m(uh) + (1-rh)*m(uc) for the data each holds."""
    best = None
    for i in range(1, 1000):
        ph = total * i / 1000
        pc = total - ph
        if dh >= ph * 0.99 or dc >= pc * 0.99:
            continue
        c = rh * COSTS[int(1000 * dh / ph)] + (1 - rh) * COSTS[int(1000 * dc / pc)]
        if best is None or c < best[0]:
            best = (c, ph)
    return best[1] if best else total * dh / max(dh + dc, 1)


def run(workload, fill, mode, policy, n, seg, cache, warm, seed, thresh=1.0, survivors=None, keep=0.0,
        by_destaged=False, age_opened=False, laps=1):
    survivors = survivors or {"hot": "ghot", "cold": "gcold"}
    draw, hot = picker(workload, n, random.Random(seed))
    segments = int(n / fill / seg)
    live = [0] * segments
    blocks = [[] for _ in range(segments)]  # blocks written into each segment (some dead since)
    newest = [0] * segments  # host write clock of the newest block a segment holds
    opened = [0] * segments  # host write clock when a segment was opened
    stream_of = [None] * segments
    free = list(range(segments))
    home = {}  # block -> segment
    open_seg = {}  # stream -> segment
    cached = OrderedDict()  # block -> rewrite interval of the version it replaced
    last = {}  # block -> host write clock of its current version
    clock, mean, dmean = [0], [float(n)], [float(n)]
    moved, destaged, recached = [0], [0], [0]
    kept = {}  # block -> laps it was re-cached since its last host write
    est = {}  # block -> running estimate of its rewrite interval (mode freq)
    rate = {"hot": 0.0, "cold": 0.0}

    def append(stream, b):
        s = open_seg.get(stream)
        if s is None:
            s = free.pop(0)
            blocks[s], newest[s], stream_of[s], opened[s] = [], 0, stream, clock[0]
            open_seg[stream] = s
        old = home.get(b)
        if old is not None:
            live[old] -= 1
            if live[old] == 0 and old not in open_seg.values():
                free.append(old)
        blocks[s].append(b)
        home[b] = s
        live[s] += 1
        newest[s] = max(newest[s], last[b])
        if len(blocks[s]) == seg:
            del open_seg[stream]

    def klass(s):
        return "hot" if stream_of[s] in ("hot", "ghot") else "cold"

    def split_class():
        """The class GC takes from: the one holding more segments than its share of the split
        that minimises the modelled cost (uniform greedy within each class)."""
        dh = sum(live[s] for s in range(segments) if s not in free and klass(s) == "hot")
        dc = sum(live[s] for s in range(segments) if s not in free and klass(s) == "cold")
        rh = rate["hot"] / max(rate["hot"] + rate["cold"], 1e-9)
        target = best_split(dh, dc, rh, segments * seg)
        used_h = sum(1 for s in range(segments) if s not in free and klass(s) == "hot") * seg
        return "hot" if used_h > target else "cold"

    def age(s):
        return clock[0] - (opened[s] if age_opened else newest[s]) + 1

    def victim():
        sealed = [s for s in range(segments) if s not in free and s not in open_seg.values()]
        if policy in ("split", "split-cb"):
            c = split_class()
            mine = [s for s in sealed if klass(s) == c and live[s] < seg] or sealed
            if policy == "split-cb":
                return max(mine, key=lambda s: (seg - live[s]) * age(s) / (seg + live[s]))
            return min(mine, key=lambda s: live[s])
        if policy == "greedy":
            return min(sealed, key=lambda s: live[s])
        return max(sealed, key=lambda s: (seg - live[s]) * age(s) / (seg + live[s]))

    def gc():
        while len(free) < 3:
            v = victim()
            for b in list(blocks[v]):
                if home.get(b) == v:
                    if mode.startswith("split"):
                        to = survivors[klass(v)]
                    elif mode in ("chain", "oracle"):
                        to = {"hot": "g1", "cold": "g2", "g1": "g2", "g2": "g3", "g3": "g3"}[stream_of[v]]
                    else:
                        to = "gc"
                    append(to, b)
                    moved[0] += 1

    def destage():
        b, interval = cached.popitem(last=False)
        # A hot block at the tail goes round the cache once more (a fast-tier write) instead of
        # to a segment, while the kept blocks are under `keep` of the cache.
        tries = 0
        while (keep > 0 and kept.get(b, 0) < laps and (b in kept or len(kept) < keep * cache)
               and interval < mean[0] * thresh and tries < cache):
            kept[b] = kept.get(b, 0) + 1
            cached[b] = interval
            recached[0] += 1
            tries += 1
            b, interval = cached.popitem(last=False)
        kept.pop(b, None)
        if interval != float("inf"):
            dmean[0] += (interval - dmean[0]) / 4096
        ref = dmean[0] if by_destaged else mean[0]
        if mode == "base":
            stream = "host"
        elif mode == "split-oracle":
            stream = "hot" if b in hot else "cold"
        elif mode == "split":
            stream = "hot" if interval < ref * thresh else "cold"
        elif mode == "split2":
            # Short interval, and the version replaced was hot too (or the interval was very short).
            was_hot = b in home and klass(home[b]) == "hot"
            short = interval < ref * thresh
            stream = "hot" if short and (was_hot or interval < ref * thresh / 4) else "cold"
        elif mode == "split-freq":
            # A per-block estimate of the rewrite interval (half the last interval, half the
            # estimate before), hot when under the threshold times the reference mean.
            e = est.get(b, float("inf"))
            stream = "hot" if e < ref * thresh else "cold"
        elif mode == "oracle":
            stream = "hot" if b in hot else "cold"
        else:
            stream = "hot" if interval < mean[0] else "cold"
        if len(free) < 3:
            gc()
        if mode.startswith("split"):
            for k in rate:
                rate[k] *= 1 - 1 / 8192
            rate[stream] += 1
        append(stream, b)
        destaged[0] += 1

    def write(b):
        clock[0] += 1
        prev = last.get(b)
        interval = clock[0] - prev if prev is not None else float("inf")
        if prev is not None:
            mean[0] += (interval - mean[0]) / 4096
            e = est.get(b)
            est[b] = interval if e is None else (e + interval) / 2
        last[b] = clock[0]
        kept.pop(b, None)
        cached.pop(b, None)
        cached[b] = interval
        while len(cached) > cache:
            destage()

    for b in range(n):
        write(b)
    for _ in range(int(warm * n)):
        write(draw())
    d0, m0, r0 = destaged[0], moved[0], recached[0]
    for _ in range(n):
        write(draw())
    return (destaged[0] - d0) / n, (moved[0] - m0) / n, (recached[0] - r0) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="80/20", choices=["uniform", "80/20", "zipf"])
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--modes", default="base,chain")
    ap.add_argument("--policies", default="greedy,cost-benefit")
    ap.add_argument("--blocks", type=int, default=65536)
    ap.add_argument("--segment", type=int, default=1024)
    ap.add_argument("--cache", type=int, default=4096)
    ap.add_argument("--warm", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--thresh", type=float, default=1.0)
    ap.add_argument("--hot-survivors", default="ghot")
    ap.add_argument("--keep", type=float, default=0.0)
    ap.add_argument("--laps", type=int, default=1)
    ap.add_argument("--mean", default="host", choices=["host", "destaged"])
    ap.add_argument("--age", default="newest", choices=["newest", "opened"])
    a = ap.parse_args()
    for mode in a.modes.split(","):
        for policy in a.policies.split(","):
            d, m, r = run(a.workload, a.fill, mode, policy, a.blocks, a.segment, a.cache, a.warm, a.seed,
                          a.thresh, {"hot": a.hot_survivors, "cold": "gcold"}, a.keep, a.mean == "destaged",
                          a.age == "opened", a.laps)
            print(f"{a.workload} fill {a.fill} {mode:6} {policy:12} keep {a.keep} laps {a.laps} mean {a.mean} age {a.age}: destaged {d:.3f}, GC moved {m:.3f}, "
                  f"total {d + m:.3f} per host write, re-cached {r:.3f}", flush=True)


if __name__ == "__main__":
    main()
