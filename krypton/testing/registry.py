"""An OCI registry for the test bed (SPEC R6b): the CNCF distribution registry built by
``hack/testbin.sh``, on loopback, with TLS from its own test-bed CA and basic auth, or on
plain HTTP. Charts are pushed with the real ``helm push`` and signed with the real
``cosign``; a keyring for Helm provenance is made with ``gpg``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import yaml

from krypton.testing import pki
from krypton.testing.host import free_port, terminate


class OciRegistry:
    """One registry process. With `tls`, it serves HTTPS with a certificate of a CA of its
    own (``ca_file``); with `auth`, it asks for ``username``/``password`` (basic auth)."""

    username = "chart-reader"

    def __init__(self, tools: Path, *, tls: bool = True, auth: bool = True,
                 password: str = "") -> None:
        self.tools, self.tls, self.auth = tools, tls, auth
        self.dir = Path(tempfile.mkdtemp(prefix="krypton-registry-"))
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.password = (password or "pw-" + os.urandom(12).hex()) if auth else ""
        self.ca_file = self.dir / "ca.crt"
        self.helm_config = self.dir / "helm-registry.json"  # helm's registry logins
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_config()

    @property
    def url(self) -> str:
        """The --chart-repo of charts pushed under ``charts/``."""
        return f"oci://{self.host}/charts"

    def _write_config(self) -> None:
        config: dict[str, object] = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.host, "secret": os.urandom(16).hex()},
        }
        if self.tls:
            ca = pki.make_ca("krypton-registry-ca")
            pair = pki.issue(ca, "127.0.0.1", server=True)
            self.ca_file.write_bytes(ca.cert)
            cert, key = pki.write(self.dir, "registry", pair)
            config["http"]["tls"] = {"certificate": str(cert), "key": str(key)}  # type: ignore[index]
        if self.auth:
            hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
            (self.dir / "htpasswd").write_text(f"{self.username}:{hashed}\n")
            config["auth"] = {"htpasswd": {"realm": "krypton-test",
                                           "path": str(self.dir / "htpasswd")}}
        (self.dir / "config.yml").write_text(yaml.safe_dump(config))

    def start(self) -> OciRegistry:
        """Start the registry (the same port and storage across restarts) and wait until
        its API answers."""
        if self._proc is not None:
            return self
        log = (self.dir / "registry.log").open("ab")
        self._proc = subprocess.Popen([str(self.tools / "registry"), "serve",
                                       str(self.dir / "config.yml")],
                                      stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._answers():
                if self.auth:
                    self._login()
                return self
            if self._proc.poll() is not None:
                raise RuntimeError(f"registry exited: {(self.dir / 'registry.log').read_text()}")
            time.sleep(0.1)
        raise TimeoutError("registry did not answer within 30s")

    def _answers(self) -> bool:
        import ssl

        scheme = "https" if self.tls else "http"
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else None
        try:
            urllib.request.urlopen(f"{scheme}://{self.host}/v2/", timeout=2,  # noqa: S310
                                   context=context)
            return True
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # it answers, and asks for credentials
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the registry process (its storage is kept for a restart)."""
        if self._proc is None:
            return
        terminate(self._proc, 10)
        self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _helm_flags(self) -> list[str]:
        flags = ["--registry-config", str(self.helm_config)]
        return flags + (["--ca-file", str(self.ca_file)] if self.tls else ["--plain-http"])

    def _login(self) -> None:
        subprocess.run([str(self.tools / "helm"), "registry", "login", self.host,
                        "--username", self.username, "--password-stdin",
                        *self._helm_flags()], input=self.password.encode(), check=True,
                       capture_output=True)

    def push(self, archive: Path) -> str:
        """``helm push`` a packaged chart under ``charts/``; returns its manifest digest as
        helm reports it."""
        out = subprocess.run([str(self.tools / "helm"), "push", str(archive), self.url,
                              *self._helm_flags()], check=True, capture_output=True, text=True)
        text = out.stdout + out.stderr
        return next(line.split()[-1] for line in text.splitlines() if line.startswith("Digest:"))

    def sign(self, chart: str, digest: str, key: Path) -> None:
        """cosign a pushed chart's manifest with the private `key` (no password), in
        cosign's signature-tag layout, offline: no transparency log."""
        env = {**os.environ, "COSIGN_PASSWORD": "", "HOME": str(self.dir)}
        if self.auth:
            env["DOCKER_CONFIG"] = str(self._docker_config())
        if self.tls:
            env["SSL_CERT_FILE"] = str(self.ca_file)
        subprocess.run([str(self.tools / "cosign"), "sign", "--key", str(key), "--yes",
                        "--use-signing-config=false", "--tlog-upload=false",
                        "--new-bundle-format=false",
                        *([] if self.tls else ["--allow-http-registry"]),
                        f"{self.host}/charts/{chart}@{digest}"],
                       env=env, check=True, capture_output=True, timeout=120)

    def _docker_config(self) -> Path:
        import base64
        import json

        path = self.dir / "docker"
        path.mkdir(exist_ok=True)
        auth = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        (path / "config.json").write_text(json.dumps({"auths": {self.host: {"auth": auth}}}))
        return path


def cosign_keys(tools: Path, directory: Path) -> tuple[Path, Path]:
    """A cosign key pair made by cosign itself (no password): (private, public)."""
    subprocess.run([str(tools / "cosign"), "generate-key-pair"], cwd=directory, check=True,
                   capture_output=True, env={**os.environ, "COSIGN_PASSWORD": ""}, timeout=60)
    return directory / "cosign.key", directory / "cosign.pub"


def gpg_keyring(directory: Path, name: str = "krypton charts") -> tuple[Path, Path]:
    """A GPG key made by gpg, for ``helm package --sign``: (secret keyring, public keyring),
    both in the legacy keyring format helm reads."""
    home = directory / "gnupg"
    home.mkdir(mode=0o700, exist_ok=True)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback",
           "--passphrase", ""]
    secret, public = directory / "secring.gpg", directory / "pubring.gpg"
    try:
        subprocess.run([*gpg, "--quick-generate-key", name, "rsa2048", "sign", "never"],
                       check=True, capture_output=True, timeout=120)
        secret.write_bytes(subprocess.run([*gpg, "--export-secret-keys", name], check=True,
                                          capture_output=True).stdout)
        public.write_bytes(subprocess.run([*gpg, "--export", name], check=True,
                                          capture_output=True).stdout)
    finally:
        # gpg started an agent for this home that outlives it: stopped here, not left behind
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                       check=False, capture_output=True, timeout=30)
    return secret, public
