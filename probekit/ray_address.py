"""A Ray address, checked in seconds before ``ray.init`` joins it, and joined where it was meant.

``ray.init(address=...)`` waits for minutes where nothing answers, and longer (more than 420 s
were seen) at a live server that is not Ray. :func:`check_ray_address` refuses both in a few
seconds: the address must accept a TCP connection within :data:`PROBE_SECONDS`, then answer
Ray's own handshake -- the call a Ray client makes first, ``GetClusterId`` of the head's GCS
(``ray.rpc.NodeInfoGcsService``), made over HTTP/2 as gRPC writes it, with a deadline of
:data:`HANDSHAKE_SECONDS` and with Ray's token when token authentication is set up (Ray's own
token loader: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``). The call is
written on the socket here because Ray installs no Python gRPC module, and Ray's C++ client
waits 13 s and logs to stderr before it gives up.

Ray rewrites a loopback address (``127.0.0.1``, ``localhost``, ``::1``) to this machine's
node IP before it connects (``ray._private.services.canonicalize_bootstrap_address``), and
gives the driver that IP too, so a head started on loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
ray start --head``: its node and GCS on 127.0.0.1 only) is never reached.
:func:`loopback_join` asks the head where its nodes are (``GetAllNodeInfo``) and, when they
are on loopback and not on the node IP, keeps Ray on loopback while ``ray.init`` runs (what
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` does to the driver), saying so in one line.

Example:
    >>> check_ray_address("127.0.0.1:99999")
    Traceback (most recent call last):
    ...
    probekit.errors.ConfigError: Ray address '127.0.0.1:99999': 99999 is not a port (1..65535). Fix: ...
"""  # noqa: E501

from __future__ import annotations

import os
import re
import socket
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from probekit.errors import ConfigError

PROBE_SECONDS = 3.0
"""How long :func:`check_ray_address` waits for the address to accept a TCP connection."""

HANDSHAKE_SECONDS = 5.0
"""How long :func:`check_ray_address` waits for the head to answer Ray's first call."""

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch that, set to 0, keeps a driver's address on loopback (read when Ray imports)."""

FIX_ADDRESS = (
    "start the head with `ray start --head --port=6379` and pass the address it prints (e.g. "
    "--ray-address 10.0.0.1:6379), or leave --ray-address out (and RAY_ADDRESS unset) to start "
    "a local Ray"
)

_GCS = "/ray.rpc.NodeInfoGcsService/"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4


class NotRay(Exception):
    """The server did not answer a gRPC call as a Ray head does; the message says how.
    ``auth``: it is a Ray head that refused the call for want of the right token."""

    def __init__(self, message: str, auth: bool = False) -> None:
        super().__init__(message)
        self.auth = auth


def check_ray_address(address: str | None) -> str | None:
    """Refuse, in seconds, a Ray address that is not a Ray head: ``address`` (or, without one,
    the ``RAY_ADDRESS`` that ``ray.init`` would join) must be ``host:port`` with a port in
    1..65535 whose host resolves, accepts a TCP connection within :data:`PROBE_SECONDS` and
    answers Ray's handshake within :data:`HANDSHAKE_SECONDS`. ``"auto"``, ``"local"`` and
    ``ray://`` client addresses are left to Ray. Returns the address checked (None: none)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or address in ("auto", "local") or address.startswith("ray://"):
        return None
    host, port = split_address(address)
    try:
        gcs_call(host, port, "GetClusterId")
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(
            f"nothing answers at the Ray address {address!r} ({reason})", fix=FIX_ADDRESS
        ) from err
    except NotRay as err:
        if err.auth:
            raise _token_refused(address) from err
        raise ConfigError(
            f"the server at the Ray address {address!r} is not a Ray head ({err})",
            fix=f"pass the address of a Ray head's GCS: {FIX_ADDRESS}; if the head uses token "
            "authentication (RAY_AUTH_MODE=token), set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH "
            "to its token here",
        ) from err
    return address


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` (``[::1]:6379`` for IPv6), else :class:`ConfigError`."""
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        what = f"{port_text or 'no port'} is not a port (1..65535)" if host else "no host:port"
        raise ConfigError(f"Ray address {address!r}: {what}", fix=FIX_ADDRESS)
    return host.strip("[]"), int(port_text)


def gcs_call(host: str, port: int, method: str, request: bytes = b"") -> bytes:
    """The reply (protobuf bytes) of the unary gRPC call ``method`` of the GCS at
    ``host:port``. Raises ``OSError`` when nothing accepts a connection, :class:`NotRay` when
    the server does not answer as a GCS within :data:`HANDSHAKE_SECONDS`."""
    deadline = time.monotonic() + HANDSHAKE_SECONDS
    with socket.create_connection((host, port), PROBE_SECONDS) as sock:
        headers = _request_headers(f"{host}:{port}", _GCS + method)
        message = struct.pack(">BI", 0, len(request)) + request
        try:
            sock.sendall(
                _PREFACE
                + _frame(_SETTINGS, 0, 0, b"")
                + _frame(_HEADERS, _END_HEADERS, 1, headers)
                + _frame(_DATA, _END_STREAM, 1, message)
            )
            return _reply(sock, deadline)
        except TimeoutError:
            raise NotRay(f"no gRPC answer within {HANDSHAKE_SECONDS:g} s") from None
        except OSError as err:
            raise NotRay(f"it closed the connection ({err.strerror or err})") from None


def _reply(sock: socket.socket, deadline: float) -> bytes:
    """The gRPC message of stream 1, read frame by frame until ``deadline``."""
    first, body = True, b""
    while True:
        kind, flags, stream, payload = _read_frame(sock, deadline)
        if first and kind != _SETTINGS:
            raise NotRay("it does not speak HTTP/2 as a gRPC server does")
        first = False
        if kind == _SETTINGS and not flags & _ACK:
            sock.sendall(_frame(_SETTINGS, _ACK, 0, b""))
        elif kind == _PING and not flags & _ACK:
            sock.sendall(_frame(_PING, _ACK, 0, payload))
        elif kind == _GOAWAY or (kind == _RST_STREAM and stream == 1):
            raise NotRay("it refused the call")
        elif kind == _DATA and stream == 1:
            body += payload
            if len(body) >= 5 and len(body) >= 5 + struct.unpack(">I", body[1:5])[0]:
                return body[5 : 5 + struct.unpack(">I", body[1:5])[0]]
        elif kind == _HEADERS and stream == 1 and flags & _END_STREAM:
            status = re.search(rb"grpc-status[\x01-\x03](\d+)", payload)  # when not Huffman-coded
            if status is not None and status[1] == b"16":  # UNAUTHENTICATED
                raise NotRay("it refused the token", auth=True)
            raise NotRay(
                "a gRPC server that refused Ray's GCS call: not a Ray head, or a head with "
                "token authentication whose token this machine lacks"
            )


def _read_frame(sock: socket.socket, deadline: float) -> tuple[int, int, int, bytes]:
    header = _read_exactly(sock, 9, deadline)
    length = int.from_bytes(header[:3], "big")
    if length > 1 << 14 or header[3] > 9:  # past the frame size we allow; no such type
        raise NotRay("it does not speak HTTP/2 as a gRPC server does")
    stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
    return header[3], header[4], stream, _read_exactly(sock, length, deadline)


def _read_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise NotRay("it closed the connection without a gRPC answer")
        data += chunk
    return data


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return head + payload


def _request_headers(authority: str, path: str) -> bytes:
    """HPACK: POST, http, the path, the authority, gRPC's content type and ``te``, and Ray's
    token when one is set up (literals, never indexed, never Huffman-coded)."""
    block = bytes([0x83, 0x86])  # :method POST, :scheme http (static table 3, 6)
    block += _literal(4, path) + _literal(1, authority) + _literal(31, "application/grpc")
    block += _literal(None, "trailers", name="te")
    for name, value in _token_headers().items():
        block += _literal(None, value, name=name.lower())
    return block


def _literal(index: int | None, value: str, name: str = "") -> bytes:
    """A literal header field without indexing: the name by its static-table index, or new."""
    head = _integer(index, 4, 0) if index is not None else b"\x00" + _string(name)
    return head + _string(value)


def _string(text: str) -> bytes:
    data = text.encode()
    return _integer(len(data), 7, 0) + data


def _integer(value: int, bits: int, first: int) -> bytes:
    limit = (1 << bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = [first | limit], value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def _token_headers(ignore_auth_mode: bool = False) -> dict[str, str]:
    """Ray's ``authorization`` header as ``ray.init`` would send it (only with
    ``RAY_AUTH_MODE=token``; any token set up here with ``ignore_auth_mode``), else none."""
    try:
        from ray._raylet import (  # type: ignore[attr-defined]  # absent from Ray's stub
            AuthenticationTokenLoader,
        )

        loader = AuthenticationTokenLoader.instance()
        return dict(loader.get_token_for_http_header(ignore_auth_mode=ignore_auth_mode))
    except Exception:  # no Ray, or a Ray without token authentication: send no token
        return {}


def _token_refused(address: str) -> ConfigError:
    if _token_headers():
        what = "refused the token set up here"
    elif _token_headers(ignore_auth_mode=True):
        what = "Ray sends no token from here: a token is set up but RAY_AUTH_MODE is not 'token'"
    else:
        what = "no token is set up here"
    return ConfigError(
        f"the Ray head at {address!r} uses token authentication and {what}",
        fix="set RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the head's "
        "token if ~/.ray/auth_token is not it (`ray get-auth-token` on the head prints it)",
    )


@contextmanager
def loopback_join(address: str | None) -> Iterator[None]:
    """Around ``ray.init(address=address)``: when Ray would rewrite the loopback ``address`` to
    this machine's node IP where the head has no node (:func:`rewrite_misses_head`), keep
    Ray on loopback as ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` does, and say so in one line."""
    rewritten = rewrite_misses_head(address)
    if rewritten is None:
        yield
        return
    from ray._private import ray_constants

    if not isinstance(getattr(ray_constants, "ENABLE_RAY_CLUSTER", None), bool):
        raise ConfigError(
            f"Ray would join {rewritten} instead of the Ray address {address!r}, where the head's "
            "nodes are not",
            fix=f"run with {LOOPBACK_ENV}=0 to keep Ray on loopback, or start the head on this "
            "machine's address (`ray start --head`) and pass the address it prints",
        )
    from tqdm.auto import tqdm

    tqdm.write(
        f"[{time.strftime('%H:%M:%S')}] Ray address {address}: the head's nodes are on "
        "loopback, so probekit keeps Ray there "
        f"({LOOPBACK_ENV}=0 does the same); Ray would otherwise join {rewritten}",
        file=sys.stderr,
    )
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def rewrite_misses_head(address: str | None) -> str | None:
    """The ``host:port`` Ray would join instead of the loopback ``address`` (or
    ``RAY_ADDRESS``) when the head's live nodes are on loopback and none is at the rewritten
    host, else None (no rewrite, or one that reaches the head, or an address not checked)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or address in ("auto", "local") or address.startswith("ray://"):
        return None
    host, port = split_address(address)
    from ray._common.network_utils import is_localhost
    from ray._private.services import resolve_ip_for_localhost

    target = resolve_ip_for_localhost(host)
    if not is_localhost(host) or target == host:
        return None
    nodes = head_nodes(host, port)
    if nodes is None or target in nodes or not any(is_localhost(ip) for ip in nodes):
        return None
    return f"{target}:{port}"


def head_nodes(host: str, port: int) -> set[str] | None:
    """The addresses of the live nodes the GCS at ``host:port`` knows, None when it cannot
    say (then Ray is left to decide)."""
    try:
        from ray.core.generated import gcs_pb2, gcs_service_pb2

        reply = gcs_service_pb2.GetAllNodeInfoReply.FromString(
            gcs_call(host, port, "GetAllNodeInfo")
        )
    except Exception:  # the check only keeps Ray on loopback; it never refuses by itself
        return None
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
    return {n.node_manager_address for n in reply.node_info_list if n.state == alive}
