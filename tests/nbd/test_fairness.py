"""Fairness: a real client beside hostile neighbours (issue finding 5), and the per-user limits of
Unix sockets. Each test starts its own server (NBD_SERVER_BIN) with the default limits.

Scenarios are in fairness.py, which also runs them against any server by hand.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

import fairness

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY_BOUND_BYTES = 512 * MiB
# Two users that are neither root nor the server's: the per-user limits apply to them.
USERS = (4242, 4243)


@pytest.fixture
def server(start_server):
    return start_server(["--size", "64M", "--export", "disk"])


@pytest.mark.parametrize("client", ["libnbd", "qemu-io"])
def test_silent_sockets_do_not_keep_a_client_out(server, client):
    took, _, _ = fairness.run_silent(server.socket, "disk", server.proc.pid, client=client)
    assert took is not None, f"{client} not served within {fairness.DEADLINE_S} s beside 200 silent sockets"


@pytest.mark.parametrize("client", ["libnbd", "qemu-io"])
def test_clients_that_never_read_neither_starve_a_client_nor_grow_memory(server, client):
    took, rss_before, rss_peak = fairness.run_deaf(server.socket, "disk", server.proc.pid, client=client)
    assert rss_peak < MEMORY_BOUND_BYTES, f"server RSS {rss_peak / MiB:.0f} MiB beside 24 deaf clients"
    assert took is not None, f"{client} not served within {fairness.DEADLINE_S} s beside 24 deaf clients"


class Holder:
    """fairness.py hold, run as user `uid`: `count` connections that negotiate GO."""

    def __init__(self, uid, socket_path, count):
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                   sys.executable, "-B", os.path.join(HERE, "fairness.py"),
                   "--socket", socket_path, "--export", "disk", "--count", str(count), "hold"]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line, f"the holder as uid {uid} failed (exit {self.proc.wait()})"
        self.outcome = json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def shared_socket(server):
    """The server's socket, open to every user (the tests run as root)."""
    os.chmod(server.dir, 0o755)
    os.chmod(server.socket, 0o777)
    return server.socket


@pytest.fixture
def holders():
    started = []
    yield lambda *args: started.append(Holder(*args)) or started[-1]
    for holder in started:
        if holder.proc.poll() is None:
            holder.proc.kill()
            holder.proc.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run clients as other users")
def test_one_unix_user_cannot_take_every_place(shared_socket, holders):
    per_user = 64   # max_connections_per_peer, default
    greedy = holders(USERS[0], shared_socket, per_user + 1)
    assert greedy.outcome["entered"] == per_user, greedy.outcome
    assert len(greedy.outcome["refused"]) == 1 and f"uid {USERS[0]}" in greedy.outcome["refused"][0]
    other = holders(USERS[1], shared_socket, 1)
    assert other.outcome == {"entered": 1, "refused": []}
    # Root is not limited per user (it could stop the server anyway).
    root = holders(0, shared_socket, 2)
    assert root.outcome == {"entered": 2, "refused": []}
    # The greedy user leaves: its places are free again.
    greedy.close()
    again = holders(USERS[0], shared_socket, 3)
    assert again.outcome == {"entered": 3, "refused": []}
