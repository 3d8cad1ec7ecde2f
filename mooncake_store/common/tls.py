"""TLS settings shared by the daemons and the client: one place that builds every context.

`TlsConfig` names three PEM files: `cert` and `key` (this process's certificate chain and private
key) and `ca` (the certificate authority that signed the peers' certificates).

- A server with `cert` and `key` serves TLS; with `ca` as well it requires every client to present
  a certificate that `ca` signed (mutual TLS), unless `require_client_cert` is False.
- A client with `ca` verifies the server against it (and the host name it dialed against the
  server certificate's names); without `ca` it uses the system's trust store.  With `cert` and
  `key` it presents them when the server asks.

gRPC (`grpc.ssl_*_credentials`), the master's framed endpoint and the node's TCP data path (both
Python's `ssl`) take their settings from here.  Same-host paths (the shared-memory hand-off and
the abstract unix sockets) never leave the host and stay plain.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from mooncake_store.common.errors import InvalidArgumentError

ENV_CA = "MOONCAKE_TLS_CA"
ENV_CERT = "MOONCAKE_TLS_CERT"
ENV_KEY = "MOONCAKE_TLS_KEY"


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the TLS {what} {path!r}: {exc.strerror}") from exc


@dataclass(frozen=True)
class TlsConfig:
    """Paths of the PEM files; all empty means plaintext.

    Example:
        tls = TlsConfig(ca="ca.pem", cert="client.pem", key="client.key")
        store = Client("10.0.0.5:50051", tls=tls)
    """

    cert: str = ""
    key: str = ""
    ca: str = ""
    require_client_cert: bool = True

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise InvalidArgumentError(
                "TLS needs both a certificate and its private key: pass --tls-cert and --tls-key "
                "together (or neither)"
            )
        for what, path in (("certificate", self.cert), ("key", self.key), ("CA", self.ca)):
            if path and not os.path.isfile(path):
                raise InvalidArgumentError(f"the TLS {what} file {path!r} does not exist")

    @property
    def enabled(self) -> bool:
        """True when a client should speak TLS (it has a CA or a certificate to present)."""
        return bool(self.ca or self.cert)

    @property
    def serves(self) -> bool:
        """True when a server has a certificate and key to serve TLS with."""
        return bool(self.cert)

    def check_daemon(self) -> None:
        """A daemon's TLS is on with a certificate: a CA alone would leave it serving plaintext."""
        if self.ca and not self.cert:
            raise InvalidArgumentError(
                "--tls-ca needs --tls-cert and --tls-key: a daemon with TLS serves it too"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsConfig:
        """The client's settings from MOONCAKE_TLS_CA / _CERT / _KEY (unset: plaintext)."""
        env = os.environ if environ is None else environ
        return cls(cert=env.get(ENV_CERT, ""), key=env.get(ENV_KEY, ""), ca=env.get(ENV_CA, ""))

    # ---- Python ssl ---------------------------------------------------------------------------

    def server_context(self) -> ssl.SSLContext:
        """The context of a TLS listener (the framed endpoint, the node's data port)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.ca:
                ctx.load_verify_locations(self.ca)
                ctx.verify_mode = (
                    ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_OPTIONAL
                )
        except (ssl.SSLError, OSError) as exc:
            raise InvalidArgumentError(f"cannot load the TLS certificate/key/CA: {exc}") from exc
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The context of a TLS connection: verifies the server, presents `cert` if set."""
        ctx = ssl.create_default_context(cafile=self.ca or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert:
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (ssl.SSLError, OSError) as exc:
                raise InvalidArgumentError(
                    f"cannot load the TLS client certificate: {exc}"
                ) from exc
        return ctx

    # ---- gRPC ---------------------------------------------------------------------------------

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        ca = _read(self.ca, "CA") if self.ca else None
        return grpc.ssl_server_credentials(
            [(_read(self.key, "key"), _read(self.cert, "certificate"))],
            root_certificates=ca,
            require_client_auth=bool(ca) and self.require_client_cert,
        )

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "CA") if self.ca else None,
            private_key=_read(self.key, "key") if self.key else None,
            certificate_chain=_read(self.cert, "certificate") if self.cert else None,
        )


PLAINTEXT = TlsConfig()


def grpc_channel(address: str, tls: TlsConfig, options: list[tuple[str, int]] | None = None
                 ) -> grpc.Channel:  # fmt: skip
    """A blocking gRPC channel to `address`, over TLS when `tls` is enabled."""
    if tls.enabled:
        return grpc.secure_channel(address, tls.grpc_channel_credentials(), options=options)
    return grpc.insecure_channel(address, options=options)


def describe_tls_failure(exc: BaseException, address: str) -> str | None:
    """A one-line explanation when `exc` is a TLS failure talking to `address`, else None."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS: the certificate of {address} is not trusted ({exc.verify_message}); pass the "
            "CA that signed it (tls_ca= / MOONCAKE_TLS_CA / --tls-ca)"
        )
    if isinstance(exc, ssl.SSLError):
        if exc.reason == "WRONG_VERSION_NUMBER":
            return (
                f"TLS handshake with {address} failed: it does not speak TLS; drop the TLS "
                "settings or start it with --tls-cert/--tls-key"
            )
        return f"TLS handshake with {address} failed ({exc.reason or exc}); check the TLS settings"
    return None


_GRPC_TLS_MARKERS = ("handshake failed", "certificate_verify_failed", "wrong_version_number",
                     "ssl_error", "tsi_")  # fmt: skip


def grpc_tls_failure(details: str, address: str) -> str | None:
    """A one-line explanation when gRPC's error `details` name a TLS failure, else None."""
    lowered = (details or "").lower()
    if not any(marker in lowered for marker in _GRPC_TLS_MARKERS):
        return None
    if "certificate_verify_failed" in lowered:
        return (
            f"TLS: the certificate of {address} is not trusted ({details.rsplit(': ', 2)[-2]}); "
            "pass the CA that signed it (tls_ca= / MOONCAKE_TLS_CA / --tls-ca)"
        )
    if "wrong_version_number" in lowered:
        return (
            f"TLS handshake with {address} failed: it does not speak TLS; drop the TLS settings "
            "or start it with --tls-cert/--tls-key"
        )
    return f"TLS handshake with {address} failed ({details}); check the TLS settings"


PLAINTEXT_HINT = (
    "if it serves TLS, pass tls_ca= (and tls_cert=/tls_key= when it asks for a client "
    "certificate) or set MOONCAKE_TLS_CA"
)
CLIENT_CERT_HINT = (
    "if it requires a client certificate, pass tls_cert= and tls_key= (or set "
    "MOONCAKE_TLS_CERT and MOONCAKE_TLS_KEY)"
)
