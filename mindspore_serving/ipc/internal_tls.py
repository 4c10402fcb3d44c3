"""Mutual TLS on the internal channels that cross hosts: the distributed worker <-> rank agents
(`MS_SERVING_DISTRIBUTED_TLS_*`) and the LLM worker <-> agents on TCP ports (`MS_SERVING_AGENT_TLS_*`).

Each host of a group has its own certificate and key, signed by one CA that every host trusts. With the three
variables of a channel set (`<PREFIX>_CERT`, `<PREFIX>_KEY`, `<PREFIX>_CA`: PEM file paths), its servers take only
clients that present a certificate of that CA, and its channels present theirs and check that the server's names
the address they dial (a subjectAltName with the host's IP). The variables travel to child processes with their
environment, so setting them in the process that starts a group covers every process of it. None set: plaintext,
as before. Some set: a RuntimeError that names the missing ones.
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

DISTRIBUTED_PREFIX = "MS_SERVING_DISTRIBUTED_TLS"
AGENT_PREFIX = "MS_SERVING_AGENT_TLS"
_PARTS = ("CERT", "KEY", "CA")


def variable_names(prefix: str) -> tuple[str, str, str]:
    """The certificate, key and CA variables of a channel."""
    cert, key, ca = (f"{prefix}_{part}" for part in _PARTS)
    return cert, key, ca


@dataclass(frozen=True)
class InternalTls:
    """This host's certificate chain and private key, and the group's CA certificates (PEM bytes)."""

    certificate: bytes
    private_key: bytes
    ca: bytes

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.private_key, certificate_chain=self.certificate
        )


def _read(variable: str, path: str) -> bytes:
    try:
        with open(path, "rb") as stream:
            content = stream.read()
    except OSError as err:
        raise RuntimeError(f"{variable}: cannot read '{path}': {err.strerror}") from None
    if b"-----BEGIN" not in content:
        raise RuntimeError(f"{variable}: '{path}' is not a PEM file")
    return content


def from_env(prefix: str, environ: Mapping[str, str] | None = None) -> InternalTls | None:
    """The channel's TLS from the environment, None when none of its variables is set."""
    environ = os.environ if environ is None else environ
    names = variable_names(prefix)
    paths = [environ.get(name, "") for name in names]
    if not any(paths):
        return None
    missing = [name for name, path in zip(names, paths) if not path]
    if missing:
        raise RuntimeError(f"mutual TLS needs {', '.join(names)} together; {', '.join(missing)} not set")
    return InternalTls(*(_read(name, path) for name, path in zip(names, paths)))


def ssl_config_env(prefix: str, ssl_config: Any) -> dict[str, str]:
    """The variables that stand for an SSLConfig (certificate, private_key, custom_ca: the group's CA) given to
    the Python API (Any: ipc does not import the server package that defines it); checked here, so a bad file
    fails the call that was given it."""
    if not getattr(ssl_config, "custom_ca", None):
        raise RuntimeError(
            "the ssl_config of an internal channel needs custom_ca: the CA that signed every host's certificate"
        )
    env = dict(
        zip(
            variable_names(prefix),
            (os.path.abspath(path) for path in (ssl_config.certificate, ssl_config.private_key, ssl_config.custom_ca)),
        )
    )
    from_env(prefix, env)
    return env


def is_unix(address: str) -> bool:
    return address.startswith("unix:")


def add_port(server: grpc.Server, address: str, tls: InternalTls | None) -> int:
    """Listens on `address`, with TLS when the channel has it (a unix socket never: it is private to the host)."""
    if tls is None or is_unix(address):
        port: int = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, tls.server_credentials())
    return port


def open_channel(address: str, options: Sequence[tuple], tls: InternalTls | None) -> grpc.Channel:
    if tls is None or is_unix(address):
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, tls.channel_credentials(), options=list(options))
