#!/usr/bin/env python3
"""Writes the seed corpora of the slice protocol's fuzz targets (tests/corpus/{parsers,session}).

Frames follow docs/design/cluster.md section 3 (request header 48 bytes, little-endian, CRC32C of
bytes 0..44 at 44..48). Run from anywhere: python3 crates/slice/tests/gen_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


READ, WRITE, FLUSH, DISCARD, FENCE, INFO = 1, 2, 3, 4, 5, 6


def req(op, tag=1, epoch=1, slice_id=0, offset=0, length=0, fua=False, payload=None, reserved=0):
    head = b"STRQ" + struct.pack("<BBH", op, 1 if fua else 0, reserved)
    head += struct.pack("<QQII", tag, epoch, slice_id, 0) + struct.pack("<QI", offset, length)
    head += struct.pack("<I", crc32c(head))
    assert len(head) == 48
    if op == WRITE and payload is None:
        payload = bytes([tag & 0xFF]) * length
    return head + (payload or b"")


def reply(status, tag, epoch, length):
    head = b"STRP" + struct.pack("<IQQI", status, tag, epoch, length)
    return head + struct.pack("<I", crc32c(head))


def slice_header(epoch, usable):
    h = b"STRIASLC" + struct.pack("<II", 1, 0) + bytes(range(16)) + struct.pack("<QQ", epoch, usable)
    return h + struct.pack("<I", crc32c(h)) + bytes(4096 - 52)


def write(folder, name, data):
    os.makedirs(os.path.join(HERE, "corpus", folder), exist_ok=True)
    with open(os.path.join(HERE, "corpus", folder, name), "wb") as f:
        f.write(data)


parsers = {
    "read": req(READ, length=4096),
    "write-fua": req(WRITE, length=4096, fua=True)[:48],
    "flush": req(FLUSH),
    "discard": req(DISCARD, length=8192, offset=4096),
    "fence": req(FENCE, epoch=7),
    "info": req(INFO),
    "max-length": req(READ, length=1 << 20),
    "over-length": req(READ, length=(1 << 20) + 4096),
    "misaligned-offset": req(READ, offset=512, length=4096),
    "fua-on-read": req(READ, length=4096, fua=True),
    "reserved-set": req(READ, length=4096, reserved=1),
    "bad-crc": req(READ, length=4096)[:44] + b"\0\0\0\0",
    "reply-ok": reply(0, 5, 3, 4096),
    "reply-fenced": reply(2, 5, 9, 0),
    "reply-bad-status": reply(99, 5, 9, 0),
    "slice-header": slice_header(12, 1 << 20),
    "empty": b"",
    "garbage": bytes(range(256)),
}
for name, data in parsers.items():
    write("parsers", name, data)

PAY = 4096
session = {
    # The normal life of a coordinator: fence, write, read, flush, discard, info.
    "fence-write-read": req(FENCE, tag=1, epoch=1) + req(WRITE, tag=2, length=PAY, fua=True)
    + req(READ, tag=3, length=PAY) + req(FLUSH, tag=4) + req(DISCARD, tag=5, length=PAY) + req(INFO, tag=6),
    # I/O before any fence: UNFENCED.
    "unfenced-write": req(WRITE, tag=1, epoch=1, length=PAY),
    # A newer owner fences, then the old epoch is refused.
    "fence-twice-then-old": req(FENCE, tag=1, epoch=1) + req(FENCE, tag=2, epoch=2)
    + req(WRITE, tag=3, epoch=1, length=PAY) + req(FENCE, tag=4, epoch=1),
    "no-such-slice": req(FENCE, tag=1, epoch=1, slice_id=9) + req(READ, tag=2, slice_id=9, length=PAY),
    "out-of-range": req(FENCE, tag=1, epoch=1) + req(READ, tag=2, offset=15 * 4096, length=2 * PAY),
    "second-slice": req(FENCE, tag=1, epoch=3, slice_id=1) + req(WRITE, tag=2, epoch=3, slice_id=1, length=PAY),
    "bad-frame-mid-stream": req(FENCE, tag=1, epoch=1) + b"STRQ" + bytes(60) + req(READ, tag=3, length=PAY),
    "truncated-payload": req(FENCE, tag=1, epoch=1) + req(WRITE, tag=2, length=PAY)[:48 + 100],
    "truncated-header": req(FENCE, tag=1, epoch=1)[:30],
    "duplicate-tags": req(FENCE, tag=1, epoch=1) + req(READ, tag=1, length=PAY) + req(READ, tag=1, length=PAY),
    "many-pipelined": req(FENCE, tag=1, epoch=1)
    + b"".join(req(WRITE, tag=10 + i, offset=(i % 15) * 4096, length=PAY) for i in range(40)),
    "garbage": bytes((i * 37) & 0xFF for i in range(300)),
}
for name, data in session.items():
    write("session", name, data)
print(f"{len(parsers)} parser and {len(session)} session seeds written")
