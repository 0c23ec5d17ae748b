"""TLS tests: each starts its own server (NBD_SERVER_BIN) with a throwaway CA and certificate.

--tls require refuses plaintext (and answers options before STARTTLS with NBD_REP_ERR_TLS_REQD);
--tls on allows both; a second STARTTLS is invalid; the data path works over TLS; with
--tls-client-ca, clients (libnbd, qemu) must present a certificate from that CA.
"""
import os
import socket
import subprocess
import tempfile
import time

import nbd
import pytest

import nbdraw


def make_certificates(directory):
    """CA + server certificate for localhost in `directory`, laid out as libnbd expects."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stria test CA",
        "-keyout", "ca-key.pem", "-out", "ca-cert.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", "server-key.pem", "-out", "server.csr")
    with open(os.path.join(directory, "ext.cnf"), "w") as ext:
        ext.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem",
        "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "server-cert.pem")
    # libnbd's certificate directory: only the CA is needed by the client.
    client_dir = os.path.join(directory, "client")
    os.mkdir(client_dir)
    os.link(os.path.join(directory, "ca-cert.pem"), os.path.join(client_dir, "ca-cert.pem"))
    return client_dir


def make_client_certificate(directory, name="client-with-cert"):
    """A client certificate from the CA in `directory`, in `directory/name` laid out as libnbd and
    qemu's tls-creds-x509 expect (ca-cert.pem, client-cert.pem, client-key.pem)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    cert_dir = os.path.join(directory, name)
    os.mkdir(cert_dir)
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", os.path.join(cert_dir, "client-key.pem"), "-out", "client.csr")
    with open(os.path.join(directory, "client-ext.cnf"), "w") as ext:
        ext.write("extendedKeyUsage=clientAuth\n")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem",
        "-CAcreateserial", "-days", "2", "-extfile", "client-ext.cnf",
        "-out", os.path.join(cert_dir, "client-cert.pem"))
    os.link(os.path.join(directory, "ca-cert.pem"), os.path.join(cert_dir, "ca-cert.pem"))
    return cert_dir


def free_tcp_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def tls_server(start_server):
    """start(mode, extra, client_ca): a server with a fresh CA; returns it and a certificate
    directory with the CA only. With client_ca, clients need a certificate from that CA
    (make_client_certificate(server.dir) makes one)."""
    def start(mode, extra=(), client_ca=False):
        directory = tempfile.mkdtemp(prefix="nbd-tls-")
        client_dir = make_certificates(directory)
        if client_ca:
            extra = list(extra) + ["--tls-client-ca", os.path.join(directory, "ca-cert.pem")]
        server = start_server(list(extra) + ["--tls", mode, "--tls-cert", os.path.join(directory, "server-cert.pem"),
                               "--tls-key", os.path.join(directory, "server-key.pem"),
                               "--size", "16M", "--export", "disk"], tmpdir=directory)
        return server, client_dir
    return start


def tls_handle(server, client_dir):
    h = nbd.NBD()
    h.set_tls(nbd.TLS_REQUIRE)
    h.set_tls_certificates(client_dir)
    h.set_tls_verify_peer(True)
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.set_uri_allow_local_file(True)
    h.connect_uri(server.uri("disk", tls=True) + f"&tls-certificates={client_dir}")
    return h


def exercise(h):
    data = os.urandom(300000)
    h.pwrite(data, 12345, nbd.CMD_FLAG_FUA)
    assert h.pread(len(data), 12345) == data
    h.flush()
    entries = []
    h.block_status(1 << 20, 0, lambda ctx, off, e, err: entries.extend(e) or 0)
    assert entries


def test_require_refuses_plaintext_and_serves_tls(tls_server):
    server, client_dir = tls_server("require")
    plain = nbd.NBD()
    plain.set_tls(nbd.TLS_DISABLE)
    with pytest.raises(nbd.Error):
        plain.connect_uri(server.uri("disk"))
    # Downgrade defence: every option before STARTTLS is refused with TLS_REQD.
    c = nbdraw.RawClient(server.socket)
    c.greet(3)
    for option, data in ((nbdraw.OPT_LIST, b""), (nbdraw.OPT_GO, c.info_data("disk")),
                         (nbdraw.OPT_STRUCTURED_REPLY, b""), (nbdraw.OPT_INFO, c.info_data("disk"))):
        assert c.option(option, data)[-1][1] == nbdraw.REP_ERR_TLS_REQD, option
    c.send_option(nbdraw.OPT_EXPORT_NAME, b"disk")   # cannot be refused politely: connection closes
    assert c.is_closed()
    c.close()
    h = tls_handle(server, client_dir)
    assert h.get_tls_negotiated()
    assert h.get_structured_replies_negotiated()
    exercise(h)
    h.shutdown()


def test_on_allows_plaintext_and_tls(tls_server):
    server, client_dir = tls_server("on")
    plain = nbd.NBD()
    plain.set_tls(nbd.TLS_DISABLE)
    plain.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    plain.connect_uri(server.uri("disk"))
    assert not plain.get_tls_negotiated()
    exercise(plain)
    plain.shutdown()
    h = tls_handle(server, client_dir)
    assert h.get_tls_negotiated()
    exercise(h)
    h.shutdown()
    # TLS_ALLOW upgrades when offered.
    h = nbd.NBD()
    h.set_tls(nbd.TLS_ALLOW)
    h.set_tls_certificates(client_dir)
    h.connect_uri(server.uri("disk"))
    assert h.get_tls_negotiated()
    h.shutdown()


def test_wrong_ca_fails_the_tls_handshake(tls_server, tmp_path):
    # libnbd verifies the server certificate only when it has a host name, so this uses TCP.
    port = free_tcp_port()
    server, client_dir = tls_server("require", ["--tcp", f"127.0.0.1:{port}"])
    other = tmp_path / "other"
    other.mkdir()
    other_client = make_certificates(str(other))
    h = nbd.NBD()
    h.set_tls(nbd.TLS_REQUIRE)
    h.set_tls_certificates(other_client)
    with pytest.raises(nbd.Error):
        h.connect_uri(f"nbds://localhost:{port}/disk")
    # The right CA verifies, and the server kept serving after the failed handshake.
    h = nbd.NBD()
    h.set_tls(nbd.TLS_REQUIRE)
    h.set_tls_certificates(client_dir)
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(f"nbds://localhost:{port}/disk")
    assert h.get_tls_negotiated()
    exercise(h)
    h.shutdown()


def test_starttls_when_off_is_policy(start_server):
    server = start_server(["--size", "1M", "--export", "disk"])
    c = nbdraw.RawClient(server.socket)
    c.greet(3)
    assert c.option(nbdraw.OPT_STARTTLS)[-1][1] == nbdraw.REP_ERR_POLICY
    assert c.option(nbdraw.OPT_STARTTLS, b"data")[-1][1] == nbdraw.REP_ERR_INVALID
    assert c.option(nbdraw.OPT_GO, c.info_data("disk"))[-1][1] == nbdraw.REP_ACK
    c.close()


# ---- client certificates ----------------------------------------------------------------------

def qemu_io_read(port, cert_dir):
    """qemu-io over TLS to 127.0.0.1:port with tls-creds-x509 from `cert_dir`: (ok, output)."""
    done = subprocess.run(
        ["qemu-io", "--object", f"tls-creds-x509,id=tls0,endpoint=client,dir={cert_dir}",
         "--image-opts", f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},"
                         "export=disk,tls-creds=tls0,tls-hostname=localhost",
         "-c", "read 0 4096"], capture_output=True, text=True, timeout=30)
    output = done.stdout + done.stderr
    return done.returncode == 0 and "read 4096/4096 bytes" in output, output


def test_client_ca_requires_a_client_certificate(tls_server, tmp_path):
    port = free_tcp_port()
    server, ca_only = tls_server("require", ["--tcp", f"127.0.0.1:{port}"], client_ca=True)
    with_cert = make_client_certificate(server.dir)
    h = tls_handle(server, with_cert)
    assert h.get_tls_negotiated()
    exercise(h)
    h.shutdown()
    # No certificate, or one from another CA: the TLS handshake fails.
    other = tmp_path / "other"
    other.mkdir()
    make_certificates(str(other))
    strangers = [ca_only, make_client_certificate(str(other), "stranger")]
    for cert_dir in strangers:
        with pytest.raises(nbd.Error):
            tls_handle(server, cert_dir)
    # qemu presents its certificate with tls-creds-x509 (dir holds ca-cert.pem, client-cert.pem,
    # client-key.pem); without one it is refused.
    ok, output = qemu_io_read(port, with_cert)
    assert ok, output
    ok, output = qemu_io_read(port, ca_only)
    assert not ok, output
    # The server kept serving.
    h = tls_handle(server, with_cert)
    exercise(h)
    h.shutdown()


def test_client_ca_needs_require(tls_server):
    for mode in ("on", "off"):
        with pytest.raises(RuntimeError):
            tls_server(mode, client_ca=True)


def test_strangers_without_certificates_take_no_place_from_a_client_with_one(tls_server):
    """Issue finding 5: 128 idle clients from distinct loopback addresses took every place in
    transmission. With client certificates required they never reach transmission: they sit in
    the handshake (where newer connections push the idle ones out), and a client with a
    certificate is served at once."""
    port = free_tcp_port()
    server, _ = tls_server("require", ["--tcp", f"127.0.0.1:{port}"], client_ca=True)
    with_cert = make_client_certificate(server.dir)
    strangers = []
    try:
        for index in range(128):
            c = nbdraw.RawClient.tcp(("127.0.0.1", port), source=f"127.0.{index // 250}.{2 + index % 250}")
            c.greet(3)
            assert c.option(nbdraw.OPT_GO, c.info_data("disk"))[-1][1] == nbdraw.REP_ERR_TLS_REQD
            strangers.append(c)
        started = time.monotonic()
        h = nbd.NBD()
        h.set_tls(nbd.TLS_REQUIRE)
        h.set_tls_certificates(with_cert)
        h.connect_uri(f"nbds://localhost:{port}/disk")
        assert len(h.pread(4096, 0)) == 4096
        took = time.monotonic() - started
        h.shutdown()
        assert took < 2.0, f"served after {took:.2f} s"
    finally:
        for c in strangers:
            c.close()
