"""Issue 31 items 5, 6: a Ray address is checked in seconds with Ray's own handshake (a live
server that is not Ray is refused, not waited on for minutes), and a loopback address whose head
is on loopback is joined there although Ray rewrites loopback to the node IP.

Fake servers listen on 127.0.0.1 only: silent, HTTP/1.1, closing, and a fake Ray GCS written as
HTTP/2 frames. The test with a real loopback-only Ray head is slow (it starts Ray).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from probekit import ray_address
from probekit.errors import ConfigError
from probekit.ray_address import check_ray_address, loopback_join, rewrite_misses_head

ROOT = Path(__file__).resolve().parent.parent


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return head + payload


def _read_request(conn: socket.socket) -> bytes:
    """Everything the client sent up to its DATA frame's end (the preface, SETTINGS, HEADERS)."""
    data = b""
    while b"\x00\x00\x05\x00\x01\x00\x00\x00\x01" not in data:  # DATA, END_STREAM, stream 1
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _gcs_answer(request: bytes, nodes: list[str], status: int | None) -> bytes:
    """A GCS's answer: trailers only with ``status``, else the reply of the method called."""
    from ray.core.generated import gcs_pb2, gcs_service_pb2

    if status is not None:
        trailers = b"\x88\x00\x0bgrpc-status" + bytes([len(str(status))]) + str(status).encode()
        return _frame(1, 0x5, 1, trailers)
    if b"GetAllNodeInfo" in request:
        reply = gcs_service_pb2.GetAllNodeInfoReply(
            node_info_list=[gcs_pb2.GcsNodeInfo(node_manager_address=ip) for ip in nodes]
        )
    else:
        reply = gcs_service_pb2.GetClusterIdReply(cluster_id=b"x" * 28)
    body = reply.SerializeToString()
    return _frame(1, 0x4, 1, b"\x88") + _frame(0, 0, 1, struct.pack(">BI", 0, len(body)) + body)


def _serve(answer) -> tuple[int, threading.Event]:
    """A server on 127.0.0.1 that gives each connection to ``answer(conn)``; its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def loop():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    answer(conn)
                except OSError:
                    pass
        server.close()

    threading.Thread(target=loop, daemon=True).start()
    return server.getsockname()[1], stop


@pytest.fixture
def serve():
    stops = []

    def start(answer):
        port, stop = _serve(answer)
        stops.append(stop)
        return port

    yield start
    for stop in stops:
        stop.set()


def fake_gcs(nodes=("127.0.0.1",), status=None):
    def answer(conn):
        request = _read_request(conn)
        conn.sendall(_frame(4, 0, 0) + _gcs_answer(request, list(nodes), status))
        time.sleep(0.2)

    return answer


def silent(conn):
    time.sleep(3)


def http_1(conn):
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    time.sleep(0.5)


def closing(conn):
    pass


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (silent, "no gRPC answer within 1 s"),
        (http_1, "does not speak HTTP/2"),
        (closing, "closed the connection"),
        (fake_gcs(status=12), "refused Ray's GCS call"),  # UNIMPLEMENTED: gRPC, not Ray
    ],
)
def test_a_live_server_that_is_not_ray_is_refused_in_seconds(serve, monkeypatch, answer, says):
    monkeypatch.setattr(ray_address, "HANDSHAKE_SECONDS", 1.0)
    port = serve(answer)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="is not a Ray head") as info:
        check_ray_address(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    assert says in str(info.value) and f"127.0.0.1:{port}" in str(info.value)
    assert "ray start --head" in str(info.value)


def test_a_head_that_wants_a_token_says_how_to_give_it(serve, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    port = serve(fake_gcs(status=16))  # UNAUTHENTICATED
    with pytest.raises(ConfigError, match="uses token authentication") as info:
        check_ray_address(f"127.0.0.1:{port}")
    assert "RAY_AUTH_MODE=token" in str(info.value)


def test_a_ray_head_passes_and_a_loopback_head_is_joined_on_loopback(serve, monkeypatch):
    from ray._private import ray_constants, services

    monkeypatch.setattr(services, "resolve_ip_for_localhost", lambda host: "10.9.9.9")
    loopback = serve(fake_gcs(nodes=["127.0.0.1"]))
    assert check_ray_address(f"127.0.0.1:{loopback}") == f"127.0.0.1:{loopback}"
    assert rewrite_misses_head(f"127.0.0.1:{loopback}") == f"10.9.9.9:{loopback}"
    assert rewrite_misses_head(f"localhost:{loopback}") == f"10.9.9.9:{loopback}"
    before = ray_constants.ENABLE_RAY_CLUSTER
    with loopback_join(f"127.0.0.1:{loopback}"):
        assert ray_constants.ENABLE_RAY_CLUSTER is False  # Ray's rewrite is off for ray.init
        assert services.get_node_ip_address() == "127.0.0.1"
    assert ray_constants.ENABLE_RAY_CLUSTER is before
    on_node_ip = serve(fake_gcs(nodes=["10.9.9.9"]))  # a head Ray's rewrite reaches: left alone
    assert rewrite_misses_head(f"127.0.0.1:{on_node_ip}") is None
    with loopback_join(f"127.0.0.1:{on_node_ip}"):
        assert ray_constants.ENABLE_RAY_CLUSTER is before
    assert rewrite_misses_head("10.9.9.9:1") is None  # not loopback: not rewritten by Ray


def test_the_cli_refuses_a_server_that_is_not_ray_in_one_line(serve, tmp_path, capsys):
    from probekit.cli import main

    port = serve(http_1)
    out = tmp_path / "s"
    argv = ["sweep", "--out", str(out), "--executor", "ray", "--ray-address", f"127.0.0.1:{port}"]
    started = time.monotonic()
    assert main([*argv, "--steps", "2"]) == 2
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a Ray head" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_loopback_only_ray_head_is_reached(tmp_path):
    """A real head on 127.0.0.1 only (its GCS and node; no token): probekit's Ray tasks run."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="pk-ray-")  # short: Ray's socket paths must stay short
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={temp}"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port, 60)
        driver = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
        code = (
            "from probekit.executor import run_tasks\n"
            f"print(run_tasks(abs, [1, -2], executor='ray', ray_address='127.0.0.1:{port}',"
            " progress=False))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=driver, capture_output=True, text=True, timeout=120
        )
        assert "[1, 2]" in done.stdout, done.stderr[-3000:]
        assert "keeps Ray there" in done.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # the GCS answers, and knows the head's node
        if ray_address.head_nodes("127.0.0.1", port):
            return
        time.sleep(0.5)
    raise AssertionError(f"no Ray head on 127.0.0.1:{port} after {seconds} s")
