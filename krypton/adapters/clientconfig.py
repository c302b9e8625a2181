"""How krypton reaches one cluster's API: where, over which TLS context, as whom
(:class:`ClientConfig`), built from a validated kubeconfig
(:mod:`krypton.decisions.clusters.kubeconfig`) or the pod's service account, never from a
process-wide default.

Certificate files for the TLS context are written to a per-cluster directory (mode
0700/0600) that the owner removes on disengage. Credentials are asked for before each
request: a fixed header, the pod's service-account token read again as it rotates, or a
trusted exec credential plugin's token, kept until it is nearly over
(:mod:`krypton.adapters.execcredentials`).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import time
from pathlib import Path
from typing import Protocol

from krypton.adapters.execcredentials import ExecCredentials
from krypton.decisions.clusters import incluster
from krypton.decisions.clusters import kubeconfig as kubeconfigs
from krypton.decisions.clusters.execplugins import PluginAccess
from krypton.decisions.errors import ClusterUnreachable, KubeconfigRejected, SettingsError


class Credentials(Protocol):
    async def authorization(self) -> str:
        """The Authorization header of the next request, "" for none."""
        ...

    def rejected(self) -> None:
        """The server answered 401 to what :meth:`authorization` gave: get a new one."""
        ...


@dataclasses.dataclass(frozen=True)
class Header:
    """A fixed Authorization header: a kubeconfig's token, or username and password."""

    value: str = ""

    async def authorization(self) -> str:
        return self.value

    def rejected(self) -> None:
        pass  # nothing else to send


MAX_TOKEN_FILE = 64 << 10  # bytes read of a token file


class TokenFile:
    """A bearer token from a file, read again once a minute: a projected service-account
    token is rotated on disk (client-go reads it as often). A read that fails keeps the
    token read before, if there is one."""

    REREAD = 60.0

    def __init__(self, path: str) -> None:
        self.path = path
        self._token = ""
        self._read_at = float("-inf")

    async def authorization(self) -> str:
        now = time.monotonic()
        if now - self._read_at >= self.REREAD:
            try:
                with open(self.path, "rb") as f:
                    self._token = f.read(MAX_TOKEN_FILE).decode().strip()
            except (OSError, UnicodeDecodeError) as exc:
                if not self._token:
                    raise ClusterUnreachable(f"cannot read the token file {self.path}: "
                                             f"{type(exc).__name__}") from None
            self._read_at = now
        return f"Bearer {self._token}" if self._token else ""

    def rejected(self) -> None:
        self._read_at = float("-inf")  # rotated since it was read: read it again


@dataclasses.dataclass
class ClientConfig:
    """How krypton reaches one cluster's API: where, over which TLS, as whom."""

    host: str
    ssl: ssl.SSLContext | bool = True  # True: the system's CAs
    credentials: Credentials = dataclasses.field(default_factory=Header)
    ca_pem: bytes = b""  # "" when the system's CAs are trusted
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    compress: bool = True  # ask for gzip answers (a kubeconfig's disable-compression: not)

    @property
    def token(self) -> str:
        """The fixed bearer token it sends, "" when it sends none or another kind."""
        header = self.credentials.value if isinstance(self.credentials, Header) else ""
        scheme, _, token = header.partition(" ")
        return token if scheme == "Bearer" else ""


def tls_context(ca_pem: bytes, cert_file: str | None, key_file: str | None, *,
                verify: bool = True) -> ssl.SSLContext:
    """A client TLS context trusting `ca_pem` (the system's CAs when empty), presenting the
    client certificate of `cert_file` and `key_file`; ValueError or OSError when they
    cannot be loaded."""
    if not verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_pem:
        ctx = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    else:
        ctx = ssl.create_default_context()
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return str(path)


def _authorization(kc: kubeconfigs.Kubeconfig, ca_pem: bytes, name: str,
                   base: Path) -> Credentials:
    if kc.plugin is not None:
        plugin = kc.plugin
        if "/" in plugin.command:  # as kubectl: a relative path from the kubeconfig's directory
            plugin = dataclasses.replace(plugin, command=str(base / plugin.command))
        return ExecCredentials(PluginAccess(kc.server, ca_pem, plugin), name)
    if kc.token_file:
        return TokenFile(str(base / kc.token_file))
    if kc.token:
        return Header(f"Bearer {kc.token}")
    if kc.username and kc.password:
        pair = f"{kc.username}:{kc.password}".encode("latin-1")
        return Header(f"Basic {base64.b64encode(pair).decode()}")
    return Header()


async def configuration_for(kc: kubeconfigs.Kubeconfig, workdir: Path, *, trust: bool = False,
                            name: str = "", base: Path | None = None) -> ClientConfig:
    """The client configuration of a validated kubeconfig; its certificates go into
    `workdir`. The files and plugin a trusted kubeconfig names (only with `trust`) are read
    and run here, relative paths from `base` (the kubeconfig's directory)."""
    if kc.uses_plugins_or_files and not trust:
        raise ValueError("kubeconfig with plugins or files needs trust")
    _private_dir(workdir)
    base = base or Path.cwd()
    ca = (base / kc.ca_file).read_bytes() if kc.ca_file else kc.ca_pem or b""
    cert_file = key_file = None
    if kc.cert_file or kc.cert_pem:
        cert_file = str(base / kc.cert_file) if kc.cert_file else \
            _write_private(workdir / "client.crt", kc.cert_pem or b"")
        key_file = str(base / kc.key_file) if kc.key_file else \
            _write_private(workdir / "client.key", kc.key_pem or b"")
    return ClientConfig(host=kc.server, ssl=tls_context(ca, cert_file, key_file,
                                                        verify=not kc.insecure),
                        credentials=_authorization(kc, ca, name or kc.context, base),
                        ca_pem=ca, cert_file=cert_file, key_file=key_file,
                        tls_server_name=kc.tls_server_name,
                        compress=not kc.disable_compression)


async def configuration_from_file(path: str, context: str | None = None, *, workdir: Path,
                                  what: str = "kubeconfig") -> ClientConfig:
    """Configuration from a kubeconfig file trusted by the operator's owner (the watch
    cluster's, the CLI user's): its plugin and files are followed as kubectl would, relative
    paths from the file's directory; certificates go into `workdir`.

    Raises SettingsError with one line when the file is missing, unreadable or unusable.
    """
    if not os.path.isfile(path):
        raise SettingsError(f"{what} {path} does not exist")
    try:
        kc = kubeconfigs.parse(Path(path).read_bytes(), context=context or None, trust=True,
                               base=str(Path(path).resolve().parent))
        return await configuration_for(kc, workdir, trust=True,
                                       base=Path(path).resolve().parent)
    except (KubeconfigRejected, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SettingsError(f"{what} {path} is not usable: {reason[:200]}") from exc


def configuration_in_cluster() -> ClientConfig | None:
    """The pod's service-account configuration (its token read again as it rotates); None
    outside a pod."""
    server = incluster.service_server(os.environ)
    if not server or not os.path.isfile(incluster.SA_TOKEN):
        return None
    try:
        ca = Path(incluster.SA_CA).read_bytes()
        return ClientConfig(host=server, ssl=tls_context(ca, None, None), ca_pem=ca,
                            credentials=TokenFile(incluster.SA_TOKEN))
    except (OSError, ValueError, ssl.SSLError):
        return None
