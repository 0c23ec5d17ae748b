#!/usr/bin/env python3
"""Writes the seed corpora of the iSCSI fuzz targets (fuzz/README.md): initiator byte streams
for `session` (logins, commands, data, task management, hostile PDUs) and inputs for `parsers`.
Run from this directory; the files it writes are committed."""
import os
import struct

IQN = b"iqn.2026-11.io.stria:p:v"


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def pdu(op, flags=0x80, data=b"", itt=1, lun=0, rest=b"", immediate=False, hdigest=False, ddigest=False, dsl=None):
    bhs = bytearray(48)
    bhs[0] = op | (0x40 if immediate else 0)
    bhs[1] = flags
    n = len(data) if dsl is None else dsl
    bhs[5:8] = n.to_bytes(3, "big")
    bhs[8:16] = lun.to_bytes(8, "big")
    bhs[16:20] = itt.to_bytes(4, "big")
    bhs[20:20 + len(rest)] = rest
    out = bytes(bhs)
    if hdigest:
        out += struct.pack("<I", crc32c(out))
    padded = data + b"\0" * ((4 - len(data) % 4) % 4)
    out += padded
    if ddigest and data:
        out += struct.pack("<I", crc32c(padded))
    return out


def keys(**kv):
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in kv.items())


def login(stage_flags, kv, itt=0, cmdsn=1, isid=b"\x00\x02\x3d\x00\x00\x01", dsl=None):
    rest = bytearray(28)
    # bytes 20-47 of a login request: CID (20-21), CmdSN (24-27), ExpStatSN (28-31)
    rest[4:8] = cmdsn.to_bytes(4, "big")
    bhs = bytearray(pdu(0x03, stage_flags, kv, itt=itt, rest=bytes(rest), immediate=True, dsl=dsl))
    bhs[8:14] = isid
    return bytes(bhs)


def normal_login(digests=False):
    d = "CRC32C" if digests else "None"
    return (login(0x81, keys(InitiatorName="iqn.fuzz:i", TargetName=IQN.decode(), SessionType="Normal", AuthMethod="None"))
            + login(0x87, keys(HeaderDigest=d, DataDigest=d, MaxRecvDataSegmentLength=8192, InitialR2T="No",
                               ImmediateData="Yes", MaxBurstLength=65536, FirstBurstLength=16384), itt=1))


def cmd(cdb, itt, cmdsn, edtl=0, read=False, write=False, data=b"", final=True, immediate=False, **kw):
    flags = (0x80 if final else 0) | (0x40 if read else 0) | (0x20 if write else 0)
    rest = bytearray(28)
    rest[0:4] = edtl.to_bytes(4, "big")
    rest[4:8] = cmdsn.to_bytes(4, "big")
    rest[12:28] = cdb.ljust(16, b"\0")
    return pdu(0x01, flags, data, itt=itt, rest=bytes(rest), immediate=immediate, **kw)


def data_out(itt, ttt, datasn, offset, data, final=True, **kw):
    rest = bytearray(28)
    rest[0:4] = ttt.to_bytes(4, "big")
    rest[16:20] = datasn.to_bytes(4, "big")
    rest[20:24] = offset.to_bytes(4, "big")
    return pdu(0x05, 0x80 if final else 0, data, itt=itt, rest=bytes(rest), **kw)


def logout(itt, cmdsn):
    rest = bytearray(28)
    rest[4:8] = cmdsn.to_bytes(4, "big")
    return pdu(0x06, 0x80, itt=itt, rest=bytes(rest), immediate=True)


read10 = lambda lba, n: bytes([0x28, 0]) + lba.to_bytes(4, "big") + b"\0" + n.to_bytes(2, "big") + b"\0"
write10 = lambda lba, n: bytes([0x2A, 0]) + lba.to_bytes(4, "big") + b"\0" + n.to_bytes(2, "big") + b"\0"
inquiry = bytes([0x12, 0, 0, 0, 96, 0])
tur = bytes(6)

session = {
    "normal-io": normal_login() + cmd(tur, 2, 1) + cmd(inquiry, 3, 2, edtl=96, read=True)
    + cmd(write10(8, 2), 4, 3, edtl=1024, write=True, data=b"\xab" * 1024)
    + cmd(read10(8, 2), 5, 4, edtl=1024, read=True) + logout(6, 5),
    "unsolicited-data": normal_login() + cmd(write10(0, 4), 2, 1, edtl=2048, write=True, data=b"\x01" * 512, final=False)
    + data_out(2, 0xFFFFFFFF, 0, 512, b"\x02" * 512, final=False) + data_out(2, 0xFFFFFFFF, 1, 1024, b"\x03" * 1024),
    "r2t-wanted": normal_login() + cmd(write10(0, 64), 2, 1, edtl=32768, write=True, data=b"\x01" * 4096),
    "data-out-bad-datasn": normal_login() + cmd(write10(0, 2), 2, 1, edtl=1024, write=True, final=False)
    + data_out(2, 0xFFFFFFFF, 5, 0, b"\x02" * 1024),
    "data-out-bad-offset": normal_login() + cmd(write10(0, 2), 2, 1, edtl=1024, write=True, final=False)
    + data_out(2, 0xFFFFFFFF, 0, 512, b"\x02" * 512),
    "data-out-unknown-task": normal_login() + data_out(77, 5, 0, 0, b"\x02" * 512),
    "same-tag-twice": normal_login() + cmd(write10(0, 2), 2, 1, edtl=1024, write=True, final=False)
    + cmd(tur, 2, 2),
    "cmdsn-outside-window": normal_login() + cmd(tur, 2, 1000) + cmd(tur, 3, 1),
    "nop-and-text": normal_login() + pdu(0x00, 0x80, b"ping", itt=9, rest=b"\xff\xff\xff\xff" + bytes(24), immediate=True)
    + pdu(0x04, 0x80, keys(SendTargets="All"), itt=10, rest=b"\xff\xff\xff\xff" + (1).to_bytes(4, "big") + bytes(20)),
    "abort-and-reset": normal_login() + cmd(write10(0, 8), 2, 1, edtl=4096, write=True, final=False)
    + pdu(0x02, 0x81, itt=3, rest=(2).to_bytes(4, "big") + (2).to_bytes(4, "big") + bytes(4) + (1).to_bytes(4, "big") + bytes(12), immediate=True)
    + pdu(0x02, 0x85, itt=4, rest=b"\xff\xff\xff\xff" + (2).to_bytes(4, "big") + bytes(20), immediate=True),
    "discovery": login(0x83, keys(InitiatorName="iqn.fuzz:i", SessionType="Discovery"))
    + pdu(0x04, 0x80, keys(SendTargets="All"), itt=2, rest=b"\xff\xff\xff\xff" + (1).to_bytes(4, "big") + bytes(20)),
    "digests": normal_login(digests=True) + cmd(inquiry, 2, 1, edtl=96, read=True, hdigest=True, ddigest=True)
    + cmd(write10(0, 1), 3, 2, edtl=512, write=True, data=b"\x07" * 512, hdigest=True, ddigest=True),
    "bad-header-digest": normal_login(digests=True) + cmd(tur, 2, 1)[:48] + b"\0\0\0\0",
    "oversized-segment": login(0x81, b"", dsl=(1 << 24) - 1),
    "login-unknown-target": login(0x81, keys(InitiatorName="i", TargetName="iqn.nope")),
    "login-chap-only": login(0x81, keys(InitiatorName="i", TargetName=IQN.decode(), AuthMethod="CHAP")),
    "login-bad-stage": login(0x8B, keys(InitiatorName="i")),
    "login-continued": login(0x40, b"InitiatorName=i\0Target") + login(0x81, b"Name=" + IQN + b"\0"),
    "garbage": bytes(range(256)) * 4,
    "empty": b"",
    "extended-cdb": normal_login() + cmd(read10(0, 1), 2, 1, edtl=512, read=True)[:4] + b"\x05" + cmd(read10(0, 1), 2, 1, edtl=512, read=True)[5:48]
    + b"\x00\x11\x01\x00" + bytes(16) + b"\0\0\0\0",
}
parsers = {
    "keys": keys(InitiatorName="iqn.i", SessionType="Normal"),
    "keys-dup": b"a=1\0a=2\0",
    "keys-malformed": b"novalue\0=x\0",
    "login-normal": normal_login(),
    "login-discovery": login(0x83, keys(InitiatorName="i", SessionType="Discovery", MaxBurstLength=512)),
    "login-reject-values": login(0x87, keys(InitiatorName="i", TargetName=IQN.decode(), MaxBurstLength="1", FirstBurstLength="x")),
    "cdb-write16": bytes([0x8A, 0]) + (5).to_bytes(8, "big") + (65536).to_bytes(4, "big") + b"\0\0",
    "cdb-caw": bytes([0x89, 0]) + bytes(8) + bytes(3) + b"\xff\0\0",
    "cdb-unmap": bytes([0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0]),
    "empty": b"",
    "garbage": bytes(range(255, -1, -1)),
}
for folder, inputs in (("session", session), ("parsers", parsers)):
    for name, data in inputs.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
