"""Fixtures for the NBD client tests (pytest; run with /usr/bin/python3 -m pytest tests/nbd).

Point the tests at any server with environment variables, or let them start nbd-mem-server:

  NBD_SOCKET           Unix socket of a running server (if unset, nbd-mem-server is started)
  NBD_EXPORT           writable export, at least 2 MiB (default "disk")
  NBD_RO_EXPORT        read-only export (tests needing it skip when unset and NBD_SOCKET is set)
  NBD_FAULTY_EXPORT    export failing with EIO at NBD_FAULT_OFFSET (default 1048576)
  NBD_SLOWZERO_EXPORT  export that refuses FAST_ZERO with ENOTSUP
  NBD_SERVER_BIN       server binary for the tests that start their own (TLS); default: the
                       workspace's target-nbd/release/examples/nbd-mem-server
"""
import os
import shutil
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BIN = os.path.join(ROOT, "target-nbd", "release", "examples", "nbd-mem-server")


def server_bin():
    return os.environ.get("NBD_SERVER_BIN", DEFAULT_BIN)


class RunningServer:
    """A server process on a Unix socket in its own temporary directory; stop() cleans up."""

    def __init__(self, args, tmpdir=None):
        self.dir = tmpdir or tempfile.mkdtemp(prefix="nbd-test-")
        self.socket = os.path.join(self.dir, "nbd.sock")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen([server_bin(), "--unix", self.socket] + args, stderr=self.log)
        for _ in range(200):
            if os.path.exists(self.socket):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.025)
        self.stop()
        raise RuntimeError(f"server did not start: {args}")

    def uri(self, export, tls=False):
        scheme = "nbds+unix" if tls else "nbd+unix"
        return f"{scheme}:///{export}?socket={self.socket}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Target:
    """Where the tests connect: socket and export names."""

    def __init__(self, socket, export, ro=None, faulty=None, slowzero=None, fault_offset=1 << 20):
        self.socket, self.export, self.ro, self.faulty, self.slowzero = socket, export, ro, faulty, slowzero
        self.fault_offset = fault_offset

    def uri(self, export=None):
        return f"nbd+unix:///{self.export if export is None else export}?socket={self.socket}"


@pytest.fixture(scope="session")
def target():
    if os.environ.get("NBD_SOCKET"):
        yield Target(
            os.environ["NBD_SOCKET"],
            os.environ.get("NBD_EXPORT", "disk"),
            os.environ.get("NBD_RO_EXPORT"),
            os.environ.get("NBD_FAULTY_EXPORT"),
            os.environ.get("NBD_SLOWZERO_EXPORT"),
            int(os.environ.get("NBD_FAULT_OFFSET", str(1 << 20))),
        )
        return
    if not os.access(server_bin(), os.X_OK):
        pytest.skip(f"no server: set NBD_SOCKET or build {server_bin()}")
    server = RunningServer(["--size", "64M", "--export", "disk", "--ro-export", "ro",
                            "--faulty-export", "bad", "--slow-zero-export", "slowzero"])
    try:
        yield Target(server.socket, "disk", "ro", "bad", "slowzero")
    finally:
        server.stop()


@pytest.fixture
def start_server():
    """Starts extra servers for one test (TLS modes); all are stopped afterwards."""
    if not os.access(server_bin(), os.X_OK):
        pytest.skip(f"no server binary {server_bin()}")
    started = []

    def start(args, tmpdir=None):
        server = RunningServer(args, tmpdir)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
