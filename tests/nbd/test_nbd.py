"""Real-client tests of an NBD server with python3-libnbd and a raw socket client.

Run: /usr/bin/python3 -m pytest tests/nbd   (see conftest.py for pointing it at another server)
"""
import errno
import os
import socket
import struct
import threading
import time

import nbd
import pytest

import nbdraw

MiB = 1 << 20


def connect(target, export=None, structured=True, meta=True, strict=True):
    h = nbd.NBD()
    if not structured:
        h.set_request_structured_replies(False)
    if meta:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if not strict:
        h.set_strict_mode(0)
    h.connect_uri(target.uri(export))
    return h


def expect_errno(code, call, *args, **kwargs):
    with pytest.raises(nbd.Error) as caught:
        call(*args, **kwargs)
    assert caught.value.errnum == code, f"expected {errno.errorcode[code]}, got {caught.value}"


def extents_of(h, count, offset, flags=0):
    got = []

    def callback(metacontext, off, entries, err):
        assert metacontext == nbd.CONTEXT_BASE_ALLOCATION
        got.extend(zip(entries[0::2], entries[1::2]))
        return 0

    h.block_status(count, offset, callback, flags)
    return got


# ---- handshake ------------------------------------------------------------------------------

def test_handshake_advertises_features(target):
    h = connect(target)
    assert h.get_size() >= 2 * MiB
    assert h.get_structured_replies_negotiated()
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    for can in (h.can_flush, h.can_fua, h.can_trim, h.can_zero, h.can_fast_zero, h.can_df,
                h.can_multi_conn, h.can_cache):
        assert can(), can.__name__
    assert not h.is_read_only()
    assert h.get_block_size(nbd.SIZE_MINIMUM) == 1
    assert h.get_block_size(nbd.SIZE_MAXIMUM) == 4 * MiB
    preferred = h.get_block_size(nbd.SIZE_PREFERRED)
    assert preferred >= 512 and preferred & (preferred - 1) == 0
    h.shutdown()


def test_list_and_info_in_option_mode(target):
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_uri(f"nbd+unix://?socket={target.socket}")
    names = []
    h.opt_list(lambda name, description: names.append(name) or 0)
    assert target.export in names
    h.set_export_name(target.export)
    h.opt_info()
    assert h.get_size() >= 2 * MiB
    h.opt_abort()


def test_unknown_option_is_refused_and_handshake_continues(target):
    c = nbdraw.RawClient(target.socket)
    c.greet(3)
    assert c.option(4242, b"payload to skip")[-1][1] == nbdraw.REP_ERR_UNSUP
    assert c.option(nbdraw.OPT_LIST, b"x")[-1][1] == nbdraw.REP_ERR_INVALID
    assert c.option(nbdraw.OPT_GO, c.info_data("no-such-export"))[-1][1] == nbdraw.REP_ERR_UNKNOWN
    assert c.option(nbdraw.OPT_GO, c.info_data(target.export))[-1][1] == nbdraw.REP_ACK
    c.send_request(nbdraw.CMD_FLUSH, cookie=5)
    assert c.read_simple_reply() == (5, 0)
    c.close()


# ---- data path ------------------------------------------------------------------------------

@pytest.mark.parametrize("structured", [True, False])
def test_write_read_round_trip_unaligned_and_fua(target, structured):
    h = connect(target, structured=structured, meta=False)
    data = os.urandom(10007)
    h.pwrite(data, 123457, nbd.CMD_FLAG_FUA)
    assert h.pread(10007, 123457) == data
    assert h.pread(3, 123456) == b"\0" + data[:2]
    h.flush()
    h.shutdown()


def test_structured_read_chunks_and_df(target):
    h = connect(target)
    h.pwrite(b"\x5a" * 8192, 5 * MiB // 4)
    chunks = []

    def chunk(subbuf, offset, status, err):
        chunks.append((len(subbuf), offset, status))
        return 0

    for flags in (0, nbd.CMD_FLAG_DF):
        chunks.clear()
        buf = h.pread_structured(8192, 5 * MiB // 4, chunk, flags)
        assert buf == b"\x5a" * 8192
        assert chunks == [(8192, 5 * MiB // 4, nbd.READ_DATA)]
    h.shutdown()


def test_block_status_tracks_holes_zeroes_and_data(target):
    h = connect(target)
    base = 2 * MiB - 256 * 1024
    h.zero(256 * 1024, base)  # may punch holes
    h.pwrite(b"\x01" * 65536, base)
    h.zero(65536, base + 131072, nbd.CMD_FLAG_NO_HOLE)
    h.trim(65536, base + 65536)
    got = extents_of(h, 256 * 1024, base)
    assert sum(length for length, _ in got) == 256 * 1024
    # The first 64 KiB are data (no HOLE, no ZERO); [128K, 192K) reads as zero.
    assert got[0] == (65536, 0)
    at, flags_at = 0, {}
    for length, flags in got:
        flags_at[at] = flags
        at += length
    zero_region = [f for start, f in flags_at.items() if 131072 <= start < 196608]
    # STATE_ZERO is optional (proto.md: a server MAY set it): a server that wrote real zeros for
    # NO_HOLE reports data there. Servers that track zeroes exactly say so with NBD_ZERO_EXACT.
    if os.environ.get("NBD_ZERO_EXACT", "1") == "1":
        assert zero_region and all(f & nbd.STATE_ZERO for f in zero_region)
    else:
        assert zero_region and not any(f & nbd.STATE_HOLE for f in zero_region), "NO_HOLE must not punch holes"
    # REQ_ONE: exactly one extent, within the request.
    one = extents_of(h, 200000, base + 100, nbd.CMD_FLAG_REQ_ONE)
    assert len(one) == 1 and 0 < one[0][0] <= 200000
    assert h.pread(65536, base + 131072) == b"\0" * 65536
    h.shutdown()


def test_fast_zero(target):
    h = connect(target)
    h.zero(65536, 3 * MiB // 2, nbd.CMD_FLAG_FAST_ZERO)
    assert h.pread(65536, 3 * MiB // 2) == b"\0" * 65536
    h.shutdown()
    if not target.slowzero:
        pytest.skip("no slow-zero export configured")
    h = connect(target, target.slowzero)
    expect_errno(errno.ENOTSUP, h.zero, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
    h.zero(4096, 0)  # without the flag it must succeed
    h.shutdown()


def test_multi_conn_flush_covers_writes_from_other_connections(target):
    writers = [connect(target, meta=False) for _ in range(3)]
    reader = connect(target, meta=False)
    for index, h in enumerate(writers):
        h.pwrite(bytes([index + 1]) * 4096, MiB + index * 4096)
    reader.flush()
    for index in range(3):
        assert reader.pread(4096, MiB + index * 4096) == bytes([index + 1]) * 4096
    for h in writers + [reader]:
        h.shutdown()


# ---- error values ---------------------------------------------------------------------------

def test_range_errors(target):
    h = connect(target, strict=False)
    size = h.get_size()
    expect_errno(errno.ENOSPC, h.pwrite, b"xy", size - 1)
    expect_errno(errno.ENOSPC, h.zero, 2, size - 1)
    expect_errno(errno.EINVAL, h.pread, 2, size - 1)
    expect_errno(errno.EINVAL, h.trim, 2, size - 1)
    expect_errno(errno.EINVAL, h.cache, 2, size - 1)
    expect_errno(errno.EINVAL, extents_of, h, 2, size - 1)
    expect_errno(errno.EINVAL, h.pread, 16, 2**63)   # offset + length far past the end
    too_long = h.get_block_size(nbd.SIZE_MAXIMUM) + 1
    expect_errno(errno.EINVAL, h.pread, too_long, 0) if size > too_long else None
    # Still usable afterwards.
    assert len(h.pread(512, 0)) == 512
    h.shutdown()


def test_flag_and_command_errors(target):
    h = connect(target, strict=False)
    expect_errno(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_NO_HOLE)      # flag not for READ
    expect_errno(errno.EINVAL, h.pwrite, b"a" * 512, 0, nbd.CMD_FLAG_REQ_ONE)
    expect_errno(errno.EINVAL, h.trim, 512, 0, nbd.CMD_FLAG_DF)
    h.shutdown()
    # DF without structured replies, block status without a metadata context.
    h = connect(target, structured=False, meta=False, strict=False)
    expect_errno(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_DF)
    h.shutdown()
    # Unknown command and unknown flag bit: libnbd will not send them, so use the raw client.
    c = nbdraw.RawClient(target.socket)
    c.go(target.export)
    c.send_request(77, cookie=1)
    assert c.read_simple_reply() == (1, errno.EINVAL)
    c.send_request(nbdraw.CMD_FLUSH, flags=1 << 13, cookie=2)
    assert c.read_simple_reply() == (2, errno.EINVAL)
    c.send_request(nbdraw.CMD_READ, cookie=3, offset=0, length=0)   # zero-length read
    assert c.read_simple_reply() == (3, 0)
    c.send_request(nbdraw.CMD_DISC)
    assert c.is_closed()


def test_block_status_without_context_is_einval(target):
    c = nbdraw.RawClient(target.socket)
    c.go(target.export, structured=True)
    c.send_request(7, cookie=9, offset=0, length=4096)   # NBD_CMD_BLOCK_STATUS
    magic, flags, kind, cookie, length = struct.unpack(">IHHQI", c.recv_exact(20))
    payload = c.recv_exact(length)
    assert (magic, kind, cookie) == (nbdraw.STRUCTURED_REPLY_MAGIC, 2**15 + 1, 9)
    assert struct.unpack(">I", payload[:4])[0] == errno.EINVAL
    c.close()


def test_read_only_export_refuses_writes_with_eperm(target):
    if not target.ro:
        pytest.skip("no read-only export configured")
    h = connect(target, target.ro, strict=False)
    assert h.is_read_only()
    expect_errno(errno.EPERM, h.pwrite, b"x" * 512, 0)
    expect_errno(errno.EPERM, h.zero, 512, 0)
    expect_errno(errno.EPERM, h.trim, 512, 0)
    assert len(h.pread(512, 0)) == 512
    h.shutdown()


def test_io_failure_is_eio(target):
    if not target.faulty:
        pytest.skip("no faulty export configured")
    h = connect(target, target.faulty)
    expect_errno(errno.EIO, h.pread, 8192, target.fault_offset - 4096)
    expect_errno(errno.EIO, h.pwrite, b"z" * 100, target.fault_offset + 10)
    assert len(h.pread(4096, 0)) == 4096
    h.shutdown()


# ---- hostile clients ------------------------------------------------------------------------

def test_disconnect_with_replies_in_flight(target):
    for round_index in range(10):
        h = connect(target, meta=False)
        for i in range(64):
            h.aio_pread(nbd.Buffer(65536), (i * 65536) % (2 * MiB))
        # Drop the connection without waiting for any reply.
        del h
    for round_index in range(10):
        c = nbdraw.RawClient(target.socket)
        c.go(target.export, structured=round_index % 2 == 0)
        batch = b"".join(struct.pack(">IHHQQI", nbdraw.REQUEST_MAGIC, 0, nbdraw.CMD_READ, i, 0, 1 << 20)
                         for i in range(64))
        c.sock.sendall(batch)
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
    h = connect(target)
    h.pwrite(b"alive", 0)
    assert h.pread(5, 0) == b"alive"
    h.shutdown()


def test_malformed_stream_on_one_connection_while_another_works(target):
    good = connect(target)
    stop = threading.Event()
    errors = []

    def hammer():
        try:
            i = 0
            while not stop.is_set():
                good.pwrite(bytes([i % 256]) * 4096, 4096 * (i % 64))
                assert good.pread(4096, 4096 * (i % 64)) == bytes([i % 256]) * 4096
                i += 1
        except Exception as exc:  # reported below
            errors.append(exc)

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        for garbage in (b"\xde\xad" * 40, struct.pack(">IHHQQI", nbdraw.REQUEST_MAGIC, 0, 1, 1, 0, 0xFFFFFFFF)):
            c = nbdraw.RawClient(target.socket)
            c.go(target.export)
            c.sock.sendall(garbage)
            assert c.is_closed(), "server kept a malformed connection open"
            c.close()
        # Garbage during the handshake, too.
        c = nbdraw.RawClient(target.socket)
        c.greet(3)
        c.sock.sendall(b"\x00" * 16)
        assert c.is_closed()
        c.close()
        time.sleep(0.2)
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    good.shutdown()
