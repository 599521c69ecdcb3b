"""A real asyncua OPC UA server on a free loopback port for the tests, in a thread with its own event
loop: variables by name in namespace urn:optimizer-tests (node ids "ns=2;s=<name>"), written with a
StatusCode of the test's choosing; started and stopped by the test (a context manager). Without security
by default; with a ServerSecurity, Basic256Sha256 SignAndEncrypt only, its users and client certificates
checked (certificates made by `make_certificate`)."""

import asyncio
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from asyncua import Server, ua
from asyncua.common.utils import ServiceError
from asyncua.crypto import cert_gen
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.crypto.validator import CertificateValidator, CertificateValidatorOptions
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from servers import free_port

NAMESPACE = "urn:optimizer-tests"


INITIAL = {ua.VariantType.String: "", ua.VariantType.Boolean: False}
SERVER_URI = "urn:freeopcua:python:server"  # asyncua's server's ApplicationUri


def make_certificate(folder: Path, name: str, uri: str, server: bool = False) -> tuple[Path, Path]:
    """A self-signed application certificate (DER) naming `uri` and this host, and its private key (PEM):
    `<name>.der` and `<name>-key.pem` in `folder`."""
    key = cert_gen.generate_private_key()
    use = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    certificate = cert_gen.generate_self_signed_app_certificate(
        key, name, {}, [x509.UniformResourceIdentifier(uri), x509.DNSName(socket.gethostname())], extended=[use])
    paths = folder / f"{name}.der", folder / f"{name}-key.pem"
    paths[0].write_bytes(certificate.public_bytes(Encoding.DER))
    paths[1].write_bytes(cert_gen.dump_private_key_as_pem(key))
    return paths


@dataclass(frozen=True)
class ServerSecurity:
    """The server's certificate and key; `users` (name -> password) the only users accepted, no anonymous
    session (None: anyone); `trusted` the only client certificates (files) accepted (None: any)."""

    certificate: Path
    private_key: Path
    users: dict[str, str] | None = None
    trusted: tuple[Path, ...] | None = None


class _Users:
    """asyncua's user manager: a user of `users` with its password, else refused (BadUserAccessDenied)."""

    def __init__(self, users: dict[str, str]):
        self.users = users

    def get_user(self, iserver, username=None, password=None, certificate=None):
        return User(role=UserRole.User) if username in self.users and self.users[username] == password else None


class _Trusted(CertificateValidator):
    """Time range and application URI checked as asyncua does, then trusted only when one of `trusted`."""

    def __init__(self, trusted: tuple[Path, ...]):
        super().__init__(CertificateValidatorOptions.BASIC_VALIDATION | CertificateValidatorOptions.PEER_CLIENT)
        self.trusted = {x509.load_der_x509_certificate(path.read_bytes()) for path in trusted}

    async def validate(self, cert, app_description) -> None:
        await super().validate(cert, app_description)
        if cert not in self.trusted:
            raise ServiceError(ua.StatusCodes.BadCertificateUntrusted)


class PlantServer:
    """`types`: a variable's data type by name (default Double); `security`: see ServerSecurity."""

    def __init__(self, names, port: int | None = None, types: dict | None = None, historize: bool = False,
                 security: ServerSecurity | None = None):
        self.names, self.port, self.types = list(names), port or free_port(), dict(types or {})
        self.historize, self.security = historize, security
        self.url = f"opc.tcp://127.0.0.1:{self.port}/plant"
        self.nodes: dict = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="opcua-test-server", daemon=True)
        self._server = None

    def node_id(self, name: str) -> str:
        return f"ns=2;s={name}"

    def _call(self, coroutine, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self) -> None:
        security = self.security
        self._server = Server(user_manager=None if security is None or security.users is None
                              else _Users(security.users))
        await self._server.init()
        self._server.set_endpoint(self.url)
        if security is None:
            self._server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        else:
            self._server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
            await self._server.load_certificate(str(security.certificate))
            await self._server.load_private_key(str(security.private_key))
            if security.users is not None:
                self._server.set_identity_tokens([ua.UserNameIdentityToken])
            if security.trusted is not None:
                self._server.set_certificate_validator(_Trusted(security.trusted))
        index = await self._server.register_namespace(NAMESPACE)
        assert index == 2
        plant = await self._server.nodes.objects.add_object(index, "Plant")
        for name in self.names:
            kind = self.types.get(name, ua.VariantType.Double)
            initial = ua.Variant(INITIAL.get(kind, 0), kind)
            self.nodes[name] = await plant.add_variable(ua.NodeId(name, index), name, initial, varianttype=kind)
            await self.nodes[name].set_writable()
        if self.historize:  # HistoryRead of every value written from here on
            await self._server.historize_node_data_change(list(self.nodes.values()), period=timedelta(hours=1))
        await self._server.start()

    def start(self) -> "PlantServer":
        self._thread.start()
        self._call(self._start())
        return self

    def set(self, name: str, value: float, status: int = ua.StatusCodes.Good) -> float:
        """Write `value` with `status` (e.g. ua.StatusCodes.BadSensorFailure, UncertainLastUsableValue), stamped
        now (the source timestamp a historian records); returns that stamp (s since the epoch)."""
        now = datetime.now(timezone.utc)
        data = ua.DataValue(ua.Variant(float(value), ua.VariantType.Double), StatusCode=ua.StatusCode(status),
                            SourceTimestamp=now, ServerTimestamp=now)
        self._call(self.nodes[name].write_value(data))
        return now.timestamp()

    def get(self, name: str):
        """The variable's current value and its VariantType."""
        value = self._call(self.nodes[name].read_data_value()).Value
        return value.Value, value.VariantType

    async def _crash(self) -> None:
        # asyncua's own stop() waits for its connections to close, and a client that reconnects within
        # it keeps one open for 30 s: stop listening first, then drop every connection, as a dying
        # process would (the server's listener and transports are asyncua internals)
        self._server.bserver._server.close()
        for transport in list(self._server.iserver.asyncio_transports):
            transport.abort()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    def close(self) -> None:
        """Go away as a crashed server does: listener and connections dropped at once."""
        if self._server is not None:
            self._call(self._crash())
            self._server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "PlantServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
