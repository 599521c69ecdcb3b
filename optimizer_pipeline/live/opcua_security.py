"""How the live service secures its connection to an OPC UA endpoint (issue 36): an asyncua client set up
from the endpoint's entry in the host's settings (`EndpointSecurity`) before it connects, and a failed
connect told apart as permanent (credentials or certificates to fix: one line to say once) or not (the
server is away or slow: worth retrying).

The password is read from the environment variable the settings name, when connecting, and handed to the
client only: messages name the variable, never its value. asyncua is imported when a client is configured.
"""

import logging
import os
from functools import partial
from pathlib import Path
from typing import Any, Mapping

from optimizer_pipeline.settings import EndpointSecurity

# the server refused the user: a wrong name or password, or no user where one is required
CREDENTIAL_CODES = ("BadUserAccessDenied", "BadIdentityTokenInvalid", "BadIdentityTokenRejected")
# the server refused the client's certificate (BadCertificateUntrusted, ...TimeInvalid, ...UriInvalid, ...)
# or the secure channel built with it
CERTIFICATE_CODE_PREFIX, SECURITY_CHECKS_CODE = "BadCertificate", "BadSecurityChecksFailed"
# the asyncua logger that logs every request a client sends, at DEBUG
REQUEST_LOGGER = "asyncua.client.ua_client.UASocketProtocol"


class _NoPasswordInRequests(logging.Filter):
    """asyncua logs each request it sends at DEBUG, ActivateSession's with the user's password in the clear
    (the request as built, before the channel encrypts it, if the policy does): that one by its name only."""

    def filter(self, record: logging.LogRecord) -> bool:
        from asyncua import ua

        if isinstance(record.args, tuple) and any(isinstance(a, ua.ActivateSessionRequest) for a in record.args):
            record.msg, record.args = "Sending: ActivateSessionRequest (not shown: it holds the password)", ()
        return True


_NO_PASSWORD_IN_REQUESTS = _NoPasswordInRequests()


class SecurityError(Exception):
    """Connecting cannot succeed until the host's settings, files or environment are fixed; the message is
    the one line to log: it names the endpoint and what to fix, never a password."""


async def configure(client: Any, security: EndpointSecurity, environ: Mapping[str, str] | None = None) -> None:
    """Set `client` (an asyncua Client, not connected yet) up as `security` says: user name and password
    (read from `environ`, default os.environ), and for a policy other than None the policy, mode, the
    client's certificate and key (the client's ApplicationUri becomes the one its certificate names, which
    servers check) and the server certificate to trust. For such a policy the server's endpoints are read
    first over the unsecured discovery channel every OPC UA server offers: an endpoint with the policy and
    mode must be there, and a pinned server certificate must be the one it presents. Else SecurityError at
    once, rather than a secure channel the server cannot decrypt and never answers (asyncua's server does
    so: the client times out as if the server were away). Without server_certificate the one presented
    there is trusted. A server that cannot be reached raises what asyncua raises (not permanent)."""
    environ = os.environ if environ is None else environ
    if security.username is not None:
        client.set_user(security.username)
    if security.password_env is not None:
        password = environ.get(security.password_env)
        if not password:
            raise SecurityError(f"opcua {security.url}: the environment variable {security.password_env} "
                                f"({security.setting('password_env')}) is not set or empty; set it to the password "
                                f"of user {security.username!r} where the live service runs")
        logging.getLogger(REQUEST_LOGGER).addFilter(_NO_PASSWORD_IN_REQUESTS)  # once: the same filter
        client.set_password(password)
    if security.security_policy != "None":
        await _secure(client, security)


async def _secure(client: Any, security: EndpointSecurity) -> None:
    from asyncua import ua
    from asyncua.crypto import security_policies
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    policy = {"Basic256Sha256": security_policies.SecurityPolicyBasic256Sha256,
              "Aes128_Sha256_RsaOaep": security_policies.SecurityPolicyAes128Sha256RsaOaep,
              "Aes256_Sha256_RsaPss": security_policies.SecurityPolicyAes256Sha256RsaPss}[security.security_policy]
    mode = ua.MessageSecurityMode[security.mode]
    certificate, private_key = _client_files(security)
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        client.application_uri = names.get_values_for_type(x509.UniformResourceIdentifier)[0]
    except (x509.ExtensionNotFound, IndexError):
        pass  # a certificate without an application URI: asyncua's default, which a checking server refuses
    server_certificate = await _server_certificate(client, security, policy.URI, mode)
    await client.set_security(policy, certificate.public_bytes(Encoding.DER),
                              private_key.private_bytes(Encoding.DER, PrivateFormat.PKCS8, NoEncryption()),
                              server_certificate=server_certificate.public_bytes(Encoding.DER), mode=mode)


def _client_files(security: EndpointSecurity) -> tuple[Any, Any]:
    """The client's certificate and its private key, from PEM or DER files."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (Encoding, PublicFormat, load_der_private_key,
                                                              load_pem_private_key)

    certificate = _load(security, "certificate", x509.load_pem_x509_certificate, x509.load_der_x509_certificate)
    private_key = _load(security, "private_key", partial(load_pem_private_key, password=None),
                        partial(load_der_private_key, password=None))
    public = (key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
              for key in (certificate.public_key(), private_key.public_key()))
    if len(set(public)) != 1:
        raise SecurityError(f"opcua {security.url}: {security.setting('private_key')} {security.private_key} is not "
                            f"the key of {security.setting('certificate')} {security.certificate}")
    return certificate, private_key


async def _server_certificate(client: Any, security: EndpointSecurity, policy_uri: str, mode: Any) -> Any:
    """The certificate of the server's endpoint with the policy and mode, as its discovery channel tells;
    the pinned one (server_certificate) when that is it."""
    from asyncua.crypto import uacrypto
    from cryptography import x509

    endpoints = await client.connect_and_get_server_endpoints()
    offered = [e for e in endpoints if e.SecurityPolicyUri == policy_uri and e.SecurityMode == mode]
    if not offered:
        kinds = sorted({f"{e.SecurityPolicyUri.rpartition('#')[2]} {e.SecurityMode.name}" for e in endpoints})
        raise SecurityError(f"opcua {security.url}: the server offers no endpoint with {security.security_policy} "
                            f"{security.mode} (it offers: {', '.join(kinds)}); fix "
                            f"{security.setting('security_policy')} or mode")
    presented = uacrypto.x509_from_der(offered[0].ServerCertificate)
    if security.server_certificate is None:
        return presented
    pinned = _load(security, "server_certificate", x509.load_pem_x509_certificate, x509.load_der_x509_certificate)
    if pinned != presented:
        raise SecurityError(f"opcua {security.url}: the server presents a certificate (SHA-256 "
                            f"{_fingerprint(presented)}...) other than {security.setting('server_certificate')} "
                            f"{security.server_certificate} ({_fingerprint(pinned)}...); if the server's certificate "
                            "was renewed, put the new one there")
    return pinned


def permanent_failure(exc: BaseException, security: EndpointSecurity) -> str | None:
    """The one line to log when `exc`, raised by `configure` or by connecting with the client it set up,
    will not pass by itself (naming the endpoint and what to fix; never the password); None when retrying
    may succeed (the server away, slow, restarting, or refusing for another reason)."""
    from asyncua import ua

    if isinstance(exc, SecurityError):
        return str(exc)
    if not isinstance(exc, ua.UaStatusCodeError) or getattr(exc, "code", None) is None:
        return None
    code = ua.StatusCode(exc.code).name
    if code in CREDENTIAL_CODES:
        who = "an anonymous session" if security.username is None else f"user {security.username!r}"
        if security.username is None:
            fix = f"set {security.setting('username')} and {security.setting('password_env')}"
        elif security.password_env is None:
            fix = f"check {security.setting('username')}; no password is sent without password_env"
        else:
            fix = f"check {security.setting('username')} and the password in ${security.password_env}"
        return f"opcua {security.url}: the server refused {who} ({code}); {fix}"
    if code.startswith(CERTIFICATE_CODE_PREFIX) or code == SECURITY_CHECKS_CODE:
        if security.certificate is None:
            return (f"opcua {security.url}: the server refused the connection ({code}); set "
                    f"{security.setting('security_policy')} and a client certificate it trusts")
        return (f"opcua {security.url}: the server refused the client certificate {security.certificate} ({code}); "
                f"have the server trust it, or fix {security.setting('certificate')}")
    return None


def _load(security: EndpointSecurity, name: str, from_pem, from_der):
    """The certificate or key in the file setting `name` names, PEM or DER; SecurityError naming it if not."""
    path: Path = getattr(security, name)
    try:
        content = path.read_bytes()
        return from_pem(content) if content.lstrip().startswith(b"-----BEGIN") else from_der(content)
    except (OSError, ValueError, TypeError) as exc:  # unreadable, not PEM / DER, an encrypted key
        reason = exc.strerror if isinstance(exc, OSError) else (str(exc).splitlines() or ["not PEM or DER"])[0]
        raise SecurityError(f"opcua {security.url}: cannot load {security.setting(name)} {path} ({reason})") from None


def _fingerprint(certificate) -> str:
    """The start of a certificate's SHA-256 fingerprint (what an administrator compares)."""
    from cryptography.hazmat.primitives import hashes

    return certificate.fingerprint(hashes.SHA256()).hex()[:16]
