"""The Dagster UI behind an authenticating proxy (docs/DEPLOYMENT.md): a real nginx runs the committed
examples/deployment/nginx-dagster-ui.conf (TLS, HTTP basic auth, the websocket upgrade) in front of a
real Dagster webserver started as `optimizer-pipeline ui` starts it. Without credentials, or with a
wrong password, the answer is 401 and nothing reaches the UI; with them, the UI answers, its GraphQL
websocket included, and never sees the password.

Only the example's listen address, upstream and file paths are replaced (each must occur exactly once
in it); its auth and proxy directives run as committed. nginx runs as the current user, its pid, logs
and temporary files in a temporary folder, and is stopped even when a test fails. Without nginx
(Debian package `nginx`, installed by .ci/ensure-servers) the tests skip with a loud reason; with the
environment variable CI set they fail (tests/servers.py).

Between nginx and the webserver sits a byte-for-byte TCP relay that records the head of each request
it passes on: that record is how "nothing reached the UI" is seen at the UI's side of the proxy.
"""

import base64
import hashlib
import http.client
import json
import grp
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import threading
from datetime import datetime, timedelta, timezone
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from optimizer_pipeline.deployment import dagster_yaml, webserver_command
from optimizer_pipeline.settings import load_settings

from process_groups import start_group, stop_group, wait_until_up
from servers import free_port, unavailable

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deployment" / "nginx-dagster-ui.conf"
SERVER_NAME = "optimizer.plant.example"
REALM = "optimizer-pipeline"
USER, PASSWORD = "alice", "correct horse battery staple"
UI_START_TIMEOUT_S = 120
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455


# ------------------------------------------------------------------ nginx and its files


def require_nginx(which=shutil.which) -> str:
    """The nginx binary (PATH, then /usr/sbin: not on a normal user's PATH); missing: skip loudly, or
    fail under CI."""
    found = which("nginx", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if found is None:
        unavailable("nginx not found; install the Debian package nginx (bash .ci/ensure-servers does it as root)")
    return found


def ssha_entry(user: str, password: str) -> str:
    """An htpasswd line in nginx's salted SHA-1 form: {SSHA}base64(sha1(password + salt) + salt)."""
    salt = os.urandom(8)
    digest = hashlib.sha1(password.encode() + salt).digest()
    return f"{user}:{{SSHA}}{base64.b64encode(digest + salt).decode()}\n"


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate for SERVER_NAME and 127.0.0.1 and its key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
    now = datetime.now(timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME),
                                                               x509.IPAddress(IPv4Address("127.0.0.1"))]), False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                   .add_extension(x509.KeyUsage(True, False, False, False, False, True, False, False, False), True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
                   .sign(key, hashes.SHA256()))
    crt, pem = folder / "proxy.crt", folder / "proxy.key"
    crt.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pem.chmod(0o600)
    return crt, pem


def render_example(port: int, upstream_port: int, folder: Path, crt: Path, key: Path) -> str:
    """The committed example with only its listen address, upstream and paths replaced."""
    text = EXAMPLE.read_text(encoding="utf-8")
    for old, new in (("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;"),
                     ("server 127.0.0.1:3000;", f"server 127.0.0.1:{upstream_port};"),
                     ("/etc/nginx/tls/optimizer.plant.example.crt", str(crt)),
                     ("/etc/nginx/tls/optimizer.plant.example.key", str(key)),
                     ("/var/log/nginx/optimizer-pipeline.access.log", str(folder / "access.log")),
                     ("/etc/nginx/optimizer-pipeline.htpasswd", str(folder / "htpasswd"))):
        assert text.count(old) == 1, f"{EXAMPLE.name} should hold {old!r} once (tests/test_deployment.py replaces it)"
        text = text.replace(old, new)
    return text


def main_config(folder: Path) -> str:
    """nginx.conf for a throwaway nginx: everything it writes inside `folder`, the example included in
    its http block as a site file is. As root, the workers would switch to `nobody`: they stay root."""
    temp = "\n".join(f"    {kind}_temp_path {folder / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                              "uwsgi", "scgi"))
    user = ""
    if os.geteuid() == 0:
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};\n"
    return (f"{user}worker_processes 1;\npid {folder / 'nginx.pid'};\nerror_log {folder / 'error.log'} notice;\n"
            f"events {{ worker_connections 64; }}\n"
            f"http {{\n    access_log {folder / 'http-access.log'};\n{temp}\n    include {folder / 'site.conf'};\n}}\n")


# ------------------------------------------------------------------ processes


def _connects(port: int):
    return lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close()


class RecordingRelay:
    """A TCP relay on a free loopback port in front of `target_port`: passes bytes both ways unchanged
    and records the head of the request each connection opens with (the example asks nginx for one
    request per connection: `Connection: close`, or the websocket's upgrade)."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.heads: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        client.settimeout(None)
        with client, socket.create_connection(self.target) as upstream:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            self.heads.append(head.split(b"\r\n\r\n", 1)[0].decode("latin-1"))
            upstream.sendall(head)
            back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
            back.start()
            self._pump(client, upstream)
            back.join()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def nginx():
    return require_nginx()


@pytest.fixture(scope="module")
def dagster_ui(nginx, tmp_path_factory):
    """The Dagster webserver on an empty home, started with the command `optimizer-pipeline ui` uses
    (optimizer_pipeline/deployment.py; without the daemon: the proxy is the subject). Yields its port."""
    home = tmp_path_factory.mktemp("ui-home")
    (home / "dagster").mkdir()
    (home / "dagster" / "dagster.yaml").write_text(dagster_yaml(load_settings(home, environ={}), home / "dagster"),
                                                encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "OPTIMIZER_"))}
    env.update(DAGSTER_HOME=str(home / "dagster"), OPTIMIZER_HOME=str(home))
    port, log = free_port(), home / "webserver.log"
    proc = start_group(webserver_command("127.0.0.1", port), log, env)
    try:
        wait_until_up(proc, log, UI_START_TIMEOUT_S, _connects(port), f"port {port}")
        yield port
    finally:
        left = stop_group(proc)
        assert not left, f"processes of the webserver's group survived the stop: {left}"


@pytest.fixture(scope="module")
def relay(dagster_ui):
    relay = RecordingRelay(dagster_ui)
    yield relay
    relay.close()


class Proxy:
    """The running nginx: HTTPS requests to it, its htpasswd and access log."""

    def __init__(self, port: int, folder: Path, certificate: Path):
        self.port, self.folder = port, folder
        self.htpasswd, self.access_log = folder / "htpasswd", folder / "access.log"
        self.tls = ssl.create_default_context(cafile=str(certificate))

    def request(self, path: str, auth: tuple[str, str] | None = None, method: str = "GET",
                body: dict | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if auth is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.tls, timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def graphql_websocket(self, auth: tuple[str, str] | None) -> tuple[int, dict[str, str], dict | None]:
        """Open the UI's GraphQL websocket as its page does (RFC 6455 handshake, protocol graphql-ws) and
        send `connection_init`: the status and headers of the handshake's answer, and the first message
        the UI sent back (None without the upgrade)."""
        key = base64.b64encode(os.urandom(16)).decode()
        lines = ["GET /graphql HTTP/1.1", f"Host: {SERVER_NAME}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Protocol: graphql-ws"]
        if auth is not None:
            lines.append("Authorization: Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        with self.tls.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            buffer = b""
            while b"\r\n\r\n" not in buffer:
                chunk = sock.recv(65536)
                assert chunk, f"the proxy closed the connection mid-answer: {buffer!r}"
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
            status = int(status_line.split()[1])
            if status != 101:
                return status, headers, None
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            assert headers.get("sec-websocket-accept") == accept
            payload = json.dumps({"type": "connection_init", "payload": {}}).encode()
            mask = os.urandom(4)
            sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask
                         + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
            while len(buffer) < 2:
                buffer += sock.recv(65536)
            assert buffer[0] & 0x0F == 0x1 and buffer[1] < 126, f"expected a short text frame: {buffer[:2]!r}"
            while len(buffer) < 2 + buffer[1]:
                buffer += sock.recv(65536)
            return status, headers, json.loads(buffer[2:2 + buffer[1]])


@pytest.fixture(scope="module")
def proxy(nginx, relay, tmp_path_factory):
    """nginx running the example in front of the relay, on a free loopback port; one user (USER) in its
    htpasswd, written here in {SSHA} form. Stopped at the end, also when a test failed."""
    folder = tmp_path_factory.mktemp("nginx")
    crt, key = self_signed_certificate(folder)
    port = free_port()
    (folder / "site.conf").write_text(render_example(port, relay.port, folder, crt, key), encoding="utf-8")
    (folder / "nginx.conf").write_text(main_config(folder), encoding="utf-8")
    (folder / "htpasswd").write_text(ssha_entry(USER, PASSWORD), encoding="utf-8")
    log = folder / "nginx.out"
    proc = start_group([nginx, "-p", f"{folder}/", "-c", str(folder / "nginx.conf"), "-e", str(folder / "error.log"),
                        "-g", "daemon off;"], log)
    try:
        wait_until_up(proc, log, 30, _connects(port), f"port {port}")
        yield Proxy(port, folder, crt)
    finally:
        left = stop_group(proc)
        assert not left, f"nginx processes survived the stop: {left}"


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("ci, outcome", [("1", pytest.fail.Exception), (None, pytest.skip.Exception)])
def test_missing_nginx_fails_in_ci_and_skips_elsewhere_naming_the_package(monkeypatch, ci, outcome):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome) as raised:
        require_nginx(which=lambda name, path=None: None)
    assert "nginx not found; install the Debian package nginx" in str(raised.value)


def _status_and_reached(proxy: Proxy, relay: RecordingRelay, **request) -> tuple[int, dict[str, str], int]:
    before = len(relay.heads)
    status, headers, _ = proxy.request(**request)
    return status, headers, len(relay.heads) - before


@pytest.mark.parametrize("auth", [None, (USER, "wrong password"), ("mallory", PASSWORD), (USER, "")],
                         ids=["no credentials", "wrong password", "unknown user", "empty password"])
@pytest.mark.parametrize("method, path, body", [("GET", "/", None), ("GET", "/server_info", None),
                                                ("POST", "/graphql", {"query": "{ version }"})],
                         ids=["page", "server_info", "graphql"])
def test_without_the_right_credentials_the_answer_is_401_and_nothing_reaches_the_ui(proxy, relay, auth, method,
                                                                                     path, body):
    status, headers, reached = _status_and_reached(proxy, relay, path=path, auth=auth, method=method, body=body)
    assert status == 401
    assert headers["WWW-Authenticate"] == f'Basic realm="{REALM}"'
    assert reached == 0, f"the UI saw {relay.heads[-reached:]}"


def test_with_the_right_credentials_the_ui_answers_without_seeing_the_password(proxy, relay):
    before = len(relay.heads)
    status, _, body = proxy.request("/server_info", auth=(USER, PASSWORD))
    assert status == 200 and "dagster_webserver_version" in json.loads(body)
    status, _, body = proxy.request("/graphql", auth=(USER, PASSWORD), method="POST", body={"query": "{ version }"})
    assert status == 200 and json.loads(body)["data"]["version"]
    status, _, body = proxy.request("/", auth=(USER, PASSWORD))
    assert status == 200 and b"<!DOCTYPE html>" in body
    heads = relay.heads[before:]
    assert [h.split("\r\n", 1)[0] for h in heads] == ["GET /server_info HTTP/1.1", "POST /graphql HTTP/1.1",
                                                      "GET / HTTP/1.1"]
    for head in heads:
        fields = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in head.split("\r\n")[1:]}
        assert "authorization" not in fields, head
        assert fields["connection"] == "close" and fields["x-forwarded-proto"] == "https", head
    # who acted: the access log names the user of every request that got through
    assert any(f" - {USER} [" in line and '"POST /graphql HTTP/1.1" 200 ' in line
               for line in proxy.access_log.read_text().splitlines())


def test_the_graphql_websocket_is_upgraded_through_the_proxy_only_with_credentials(proxy, relay):
    before = len(relay.heads)
    status, _, message = proxy.graphql_websocket(auth=None)
    assert (status, message, len(relay.heads) - before) == (401, None, 0)
    status, headers, message = proxy.graphql_websocket(auth=(USER, PASSWORD))
    assert status == 101 and headers["sec-websocket-protocol"] == "graphql-ws"
    assert message == {"type": "connection_ack"}
    head = relay.heads[-1]
    assert head.startswith("GET /graphql HTTP/1.1\r\n") and "\r\nUpgrade: websocket" in head
    assert "\r\nConnection: upgrade" in head and "Authorization" not in head


def test_a_user_added_with_openssl_passwd_gets_in_without_a_reload_and_is_out_once_removed(proxy):
    """The page's command for a password line (`openssl passwd -6`, SHA-512 crypt); nginx reads the file
    on every request."""
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("openssl not found (Debian package openssl): the page's htpasswd command cannot be checked")
    hashed = subprocess.run([openssl, "passwd", "-6", "-stdin"], input="bob's password\n", text=True,
                            capture_output=True, check=True).stdout.strip()
    assert hashed.startswith("$6$")
    kept = proxy.htpasswd.read_text(encoding="utf-8")
    try:
        proxy.htpasswd.write_text(kept + f"bob:{hashed}\n", encoding="utf-8")
        assert proxy.request("/server_info", auth=("bob", "bob's password"))[0] == 200
        assert proxy.request("/server_info", auth=("bob", "bob's passwort"))[0] == 401
    finally:
        proxy.htpasswd.write_text(kept, encoding="utf-8")
    assert proxy.request("/server_info", auth=("bob", "bob's password"))[0] == 401
    assert proxy.request("/server_info", auth=(USER, PASSWORD))[0] == 200
