#!/usr/bin/env python3
"""Writes the seed corpora for the NBD fuzz targets into crates/nbd/tests/corpus/{session,parsers}.

session seeds are complete client byte streams (client flags, options, requests) for
stria_nbd::fuzzing::session, whose server has exports "disk" (1 MiB), "ro" and "bad".
parsers seeds follow stria_nbd::fuzzing::parsers: byte 0 selects the parser (0 option, 1 request,
2 extents). Deterministic: running it twice gives the same files.
"""
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "crates", "nbd", "tests", "corpus")

IHAVEOPT = 0x49484156454F5054
REQ_MAGIC = 0x25609513
OPT = dict(EXPORT_NAME=1, ABORT=2, LIST=3, STARTTLS=5, INFO=6, GO=7, SR=8, LIST_META=9, SET_META=10)
CMD = dict(READ=0, WRITE=1, DISC=2, FLUSH=3, TRIM=4, CACHE=5, ZERO=6, STATUS=7)
FUA, NO_HOLE, DF, REQ_ONE, FAST_ZERO = 1, 2, 4, 8, 16


def option(code, data=b""):
    return struct.pack(">QII", IHAVEOPT, code, len(data)) + data


def s32(text):
    data = text.encode() if isinstance(text, str) else text
    return struct.pack(">I", len(data)) + data


def info(name, types=()):
    return s32(name) + struct.pack(">H", len(types)) + b"".join(struct.pack(">H", t) for t in types)


def meta(name, queries):
    return s32(name) + struct.pack(">I", len(queries)) + b"".join(s32(q) for q in queries)


def request(kind, flags=0, cookie=1, offset=0, length=0, data=b""):
    return struct.pack(">IHHQQI", REQ_MAGIC, flags, kind, cookie, offset, length) + data


def go(name="disk", structured=True, meta_ctx=True):
    out = struct.pack(">I", 3)
    if structured:
        out += option(OPT["SR"])
    if meta_ctx:
        out += option(OPT["SET_META"], meta(name, ["base:allocation"]))
    return out + option(OPT["GO"], info(name, [1, 2, 3]))


def session_seeds():
    seeds = {}
    seeds["greeting-only"] = struct.pack(">I", 1)
    seeds["bad-client-flags"] = struct.pack(">I", 0xFF)
    seeds["non-fixed"] = struct.pack(">I", 0)
    seeds["list-abort"] = struct.pack(">I", 1) + option(OPT["LIST"]) + option(OPT["ABORT"])
    seeds["unknown-option"] = struct.pack(">I", 1) + option(99, b"junk") + option(OPT["ABORT"])
    seeds["starttls-off"] = struct.pack(">I", 1) + option(OPT["STARTTLS"]) + option(OPT["ABORT"])
    seeds["info-unknown"] = struct.pack(">I", 1) + option(OPT["INFO"], info("nope", [0, 1, 2, 3]))
    seeds["info-default"] = struct.pack(">I", 1) + option(OPT["INFO"], info("", [1]))
    seeds["list-meta"] = struct.pack(">I", 1) + option(OPT["SR"]) + option(OPT["LIST_META"], meta("disk", []))
    seeds["list-meta-base"] = struct.pack(">I", 1) + option(OPT["SR"]) + option(OPT["LIST_META"], meta("disk", ["base:"]))
    seeds["set-meta-no-sr"] = struct.pack(">I", 1) + option(OPT["SET_META"], meta("disk", ["base:allocation"]))
    seeds["meta-bad-count"] = struct.pack(">I", 1) + option(OPT["SR"]) + option(OPT["LIST_META"], s32("disk") + struct.pack(">I", 0xFFFF))
    seeds["export-name"] = struct.pack(">I", 3) + option(OPT["EXPORT_NAME"], b"disk") + request(CMD["READ"], length=512) + request(CMD["DISC"])
    seeds["export-name-unknown"] = struct.pack(">I", 1) + option(OPT["EXPORT_NAME"], b"zzz")
    seeds["option-too-large"] = struct.pack(">I", 1) + struct.pack(">QII", IHAVEOPT, OPT["GO"], 0xFFFFFFFF)
    seeds["bad-option-magic"] = struct.pack(">I", 1) + b"\x00" * 16
    seeds["long-name"] = struct.pack(">I", 1) + option(OPT["GO"], info("x" * 5000))
    seeds["rw-simple"] = go(structured=False, meta_ctx=False) + request(CMD["WRITE"], FUA, 1, 4000, 300, b"\xab" * 300) \
        + request(CMD["READ"], 0, 2, 3990, 320) + request(CMD["FLUSH"], 0, 3) + request(CMD["DISC"])
    seeds["rw-structured"] = go() + request(CMD["WRITE"], 0, 1, 0, 4096, b"\x01" * 4096) \
        + request(CMD["READ"], DF, 2, 0, 8192) + request(CMD["STATUS"], 0, 3, 0, 1 << 20) \
        + request(CMD["STATUS"], REQ_ONE, 4, 100, 5000) + request(CMD["DISC"])
    seeds["zero-trim-cache"] = go() + request(CMD["ZERO"], NO_HOLE, 1, 8192, 8192) \
        + request(CMD["ZERO"], FAST_ZERO, 2, 0, 4096) + request(CMD["TRIM"], FUA, 3, 0, 65536) \
        + request(CMD["CACHE"], 0, 4, 0, 65536) + request(CMD["STATUS"], 0, 5, 0, 65536)
    seeds["errors"] = go(structured=False, meta_ctx=False) + request(CMD["READ"], 0, 1, 1 << 20, 1) \
        + request(CMD["WRITE"], 0, 2, (1 << 20) - 1, 2, b"zz") + request(77, 0, 3) \
        + request(CMD["READ"], 1 << 9, 4, 0, 1) + request(CMD["STATUS"], 0, 5, 0, 1) \
        + request(CMD["READ"], 0, 6, 0xFFFFFFFFFFFFFFF0, 0x100) + request(CMD["TRIM"], 0, 7, 1 << 20, 1)
    seeds["zero-length"] = go() + request(CMD["READ"], 0, 1) + request(CMD["WRITE"], 0, 2) \
        + request(CMD["TRIM"], 0, 3) + request(CMD["ZERO"], 0, 4) + request(CMD["STATUS"], 0, 5)
    seeds["read-only"] = go("ro") + request(CMD["WRITE"], 0, 1, 0, 4, b"abcd") + request(CMD["ZERO"], 0, 2, 0, 4) \
        + request(CMD["TRIM"], 0, 3, 0, 4) + request(CMD["READ"], 0, 4, 0, 4)
    seeds["faulty"] = go("bad") + request(CMD["READ"], 0, 1, 4000, 200) + request(CMD["WRITE"], 0, 2, 8000, 4, b"abcd")
    seeds["oversized-write"] = go() + request(CMD["WRITE"], 0, 1, 0, 0xFFFFFFFF)
    seeds["truncated-write"] = go() + request(CMD["WRITE"], 0, 1, 0, 4096, b"\x02" * 100)
    seeds["bad-request-magic"] = go() + b"\xde" * 28
    seeds["many-reads"] = go() + b"".join(request(CMD["READ"], 0, i, (i * 4096) % (1 << 20), 4096) for i in range(40))
    seeds["meta-other-export"] = struct.pack(">I", 1) + option(OPT["SR"]) + option(OPT["SET_META"], meta("ro", ["base:allocation"])) \
        + option(OPT["GO"], info("disk")) + request(CMD["STATUS"], 0, 1, 0, 4096)
    return seeds


def parser_seeds():
    seeds = {}
    for name, code in OPT.items():
        data = {"GO": info("disk", [0, 3]), "INFO": info("", []), "LIST_META": meta("disk", ["base:"]),
                "SET_META": meta("disk", ["base:allocation"]), "EXPORT_NAME": b"disk"}.get(name, b"")
        seeds[f"opt-{name.lower()}"] = b"\x00" + struct.pack(">I", code) + data
    seeds["opt-lying-len"] = b"\x00" + struct.pack(">I", OPT["GO"]) + struct.pack(">I", 0xFFFFFFF0) + b"ab"
    for name, kind in CMD.items():
        for flags in (0, FUA | DF | REQ_ONE):
            hdr = struct.pack(">IHHQQI", REQ_MAGIC, flags, kind, 7, 4096, 512)
            tail = struct.pack(">I", 1 << 12) + bytes([0x07])
            seeds[f"req-{name.lower()}-{flags}"] = b"\x01" + hdr + b"\x08" + tail
    seeds["req-overflow"] = b"\x01" + struct.pack(">IHHQQI", REQ_MAGIC, 0, 0, 1, 0xFFFFFFFFFFFFFFFF, 2) + b"\x20\xff\xff\xff\xff\x00"
    seeds["extents"] = b"\x02" + struct.pack(">I", 10000) + b"".join(struct.pack(">IB", n, f) for n, f in [(4096, 3), (0, 0), (4096, 3), (8192, 0), (100000, 2)])
    seeds["extents-req-one"] = b"\x02" + struct.pack(">I", 10001) + struct.pack(">IB", 1 << 31, 1)
    return seeds


def main():
    for folder, seeds in (("session", session_seeds()), ("parsers", parser_seeds())):
        path = os.path.join(OUT, folder)
        os.makedirs(path, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(path, f"seed-{name}"), "wb") as f:
                f.write(data)
        print(f"{len(seeds)} seeds in {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
