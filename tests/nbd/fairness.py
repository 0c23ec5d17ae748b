"""Fairness scenarios against a running NBD server: hostile neighbours, then a well-behaved client.

Used by test_fairness.py, and as a script against any server (nbd-mem-server, `stria serve`):

  /usr/bin/python3 tests/nbd/fairness.py --socket SOCK --export NAME [--pid PID] silent|deaf
  /usr/bin/python3 tests/nbd/fairness.py --socket SOCK --export NAME --count N hold

silent: 200 Unix sockets connect and say nothing; then a real client (libnbd) connects and reads.
deaf:   24 clients pipeline 1 MiB reads and never read a reply; then the real client reads; the
        server's RSS (from /proc/PID/status) is reported at its peak.
Each prints the seconds the real client took and exits non-zero past the deadline (2 s).
hold:   N clients negotiate NBD_OPT_GO; prints one JSON line (how many entered transmission, the
        messages of the refused) and holds the connections until stdin closes. Run it as another
        user (setpriv) to see the per-user limits of Unix sockets.
"""
import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import time

import nbdraw

MiB = 1 << 20
SILENT_SOCKETS = 200
DEAF_CLIENTS = 24
DEAF_READS_PER_CLIENT = 96
DEAF_READ_BYTES = 1 * MiB
DEADLINE_S = 2.0


def rss_bytes(pid):
    """Resident set size of process `pid`."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def silent_sockets(socket_path, count=SILENT_SOCKETS):
    """`count` connections that never send a byte (and never read the greeting)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(socket_path)
        sockets.append(sock)
    return sockets


def deaf_clients(socket_path, export, count=DEAF_CLIENTS, reads=DEAF_READS_PER_CLIENT,
                 read_bytes=DEAF_READ_BYTES):
    """`count` clients that enter transmission, pipeline `reads` reads and never read a reply."""
    clients = []
    for _ in range(count):
        client = nbdraw.RawClient(socket_path, timeout=10.0)
        client.go(export)
        batch = b"".join(
            struct.pack(">IHHQQI", nbdraw.REQUEST_MAGIC, 0, nbdraw.CMD_READ, cookie,
                                      (cookie * read_bytes) % (16 * MiB), read_bytes)
            for cookie in range(reads))
        client.sock.sendall(batch)
        clients.append(client)
    return clients


def well_behaved_read(socket_path, export, deadline_s=DEADLINE_S, client="libnbd"):
    """Seconds until a real client has connected and read 4 KiB, retrying a refused connection
    until `deadline_s`; None if it did not make it (the client is killed at the deadline)."""
    uri = f"nbd+unix:///{export}?socket={socket_path}"
    if client == "libnbd":
        # What nbdsh -u URI -c ... does, with the python that has the nbd module.
        script = "import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); " \
                 "assert len(h.pread(4096, 0)) == 4096; h.shutdown()"
        command = ["/usr/bin/python3", "-c", script, uri]
    else:
        command = ["qemu-io", "-r", "-f", "raw", uri, "-c", "read 0 4096"]
    started = time.monotonic()
    while True:
        left = deadline_s - (time.monotonic() - started)
        if left <= 0:
            return None
        try:
            done = subprocess.run(command, capture_output=True, timeout=left)
        except subprocess.TimeoutExpired:
            return None
        if done.returncode == 0 and b"error" not in done.stdout.lower():
            return time.monotonic() - started
        time.sleep(0.05)


def settle(pid, seconds=1.0):
    """Waits `seconds`, sampling RSS; returns the peak."""
    peak = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pid:
            peak = max(peak, rss_bytes(pid))
        time.sleep(0.05)
    return peak


def close_all(things):
    for thing in things:
        thing.close()


def run_silent(socket_path, export, pid=None, client="libnbd"):
    rss_before = rss_bytes(pid) if pid else 0
    sockets = silent_sockets(socket_path)
    try:
        settle(pid, 0.5)
        took = well_behaved_read(socket_path, export, client=client)
        rss_peak = rss_bytes(pid) if pid else 0
    finally:
        close_all(sockets)
    return took, rss_before, rss_peak


def run_deaf(socket_path, export, pid=None, client="libnbd"):
    rss_before = rss_bytes(pid) if pid else 0
    clients = deaf_clients(socket_path, export)
    try:
        rss_peak = settle(pid, 1.5)
        took = well_behaved_read(socket_path, export, client=client)
        rss_peak = max(rss_peak, rss_bytes(pid) if pid else 0)
    finally:
        close_all(clients)
    return took, rss_before, rss_peak


def hold(socket_path, export, count):
    """`count` clients that negotiate GO; returns them and what the server answered."""
    clients, entered, refused = [], 0, []
    for _ in range(count):
        client = nbdraw.RawClient(socket_path, timeout=10.0)
        client.greet(3)
        option, reply_type, data = client.option(nbdraw.OPT_GO, client.info_data(export))[-1]
        if reply_type == nbdraw.REP_ACK:
            entered += 1
        else:
            refused.append(data.decode(errors="replace"))
        clients.append(client)
    return clients, {"entered": entered, "refused": refused}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--export", default="disk")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("scenario", choices=["silent", "deaf", "hold"])
    args = parser.parse_args()
    if args.scenario == "hold":
        clients, outcome = hold(args.socket, args.export, args.count)
        print(json.dumps(outcome), flush=True)
        sys.stdin.read()
        close_all(clients)
        return 0
    run = run_silent if args.scenario == "silent" else run_deaf
    took, rss_before, rss_peak = run(args.socket, args.export, args.pid)
    shown = "not served" if took is None else f"{took:.3f} s"
    print(f"{args.scenario}: well-behaved client: {shown}; server RSS {rss_before / MiB:.0f} MiB before, "
          f"{rss_peak / MiB:.0f} MiB peak")
    return 0 if took is not None else 1


if __name__ == "__main__":
    sys.exit(main())
