"""A raw NBD client over a Unix socket, for what libnbd will not send: unknown commands, garbage,
options before TLS, abrupt disconnects. Only the protocol's numbers; no policy."""
import socket
import struct

IHAVEOPT = 0x49484156454F5054
NBDMAGIC = 0x4E42444D41474943
OPT_REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY = 1, 2, 3, 5, 6, 7, 8
REP_ACK, REP_SERVER, REP_INFO = 1, 2, 3
REP_ERR_UNSUP, REP_ERR_POLICY, REP_ERR_INVALID = 2**31 + 1, 2**31 + 2, 2**31 + 3
REP_ERR_TLS_REQD, REP_ERR_UNKNOWN = 2**31 + 5, 2**31 + 6
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH = 0, 1, 2, 3


class RawClient:
    def __init__(self, socket_path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(socket_path)

    @classmethod
    def tcp(cls, address, source=None, timeout=10.0):
        """A client over TCP to `address` (host, port), from the local address `source`."""
        client = cls.__new__(cls)
        client.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.sock.settimeout(timeout)
        if source:
            client.sock.bind((source, 0))
        client.sock.connect(address)
        return client

    def close(self):
        self.sock.close()

    def recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError(f"server closed after {len(data)} of {n} bytes")
            data += chunk
        return data

    def greet(self, client_flags=1):
        magic, opt_magic, flags = struct.unpack(">QQH", self.recv_exact(18))
        assert magic == NBDMAGIC and opt_magic == IHAVEOPT, "not an NBD newstyle server"
        self.sock.sendall(struct.pack(">I", client_flags))
        return flags

    def send_option(self, option, data=b""):
        self.sock.sendall(struct.pack(">QII", IHAVEOPT, option, len(data)) + data)

    def read_option_reply(self):
        magic, option, reply_type, length = struct.unpack(">QIII", self.recv_exact(20))
        assert magic == OPT_REPLY_MAGIC
        return option, reply_type, self.recv_exact(length)

    def option(self, option, data=b""):
        """Sends an option and returns all replies up to the final one."""
        self.send_option(option, data)
        replies = []
        while True:
            reply = self.read_option_reply()
            replies.append(reply)
            if reply[1] == REP_ACK or reply[1] & (1 << 31):
                return replies

    @staticmethod
    def info_data(name, info_types=()):
        raw = name.encode()
        return struct.pack(">I", len(raw)) + raw + struct.pack(">H", len(info_types)) + b"".join(
            struct.pack(">H", t) for t in info_types)

    def go(self, name, structured=False):
        self.greet(3)
        if structured:
            assert self.option(OPT_STRUCTURED_REPLY)[-1][1] == REP_ACK
        replies = self.option(OPT_GO, self.info_data(name))
        assert replies[-1][1] == REP_ACK, f"GO failed: {replies}"

    def send_request(self, kind, flags=0, cookie=1, offset=0, length=0, data=b""):
        self.sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, flags, kind, cookie, offset, length) + data)

    def read_simple_reply(self):
        magic, error, cookie = struct.unpack(">IIQ", self.recv_exact(16))
        assert magic == SIMPLE_REPLY_MAGIC, hex(magic)
        return cookie, error

    def is_closed(self):
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
