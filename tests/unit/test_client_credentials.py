"""What krypton's own client sends as whom, from a trusted kubeconfig file (the watch
cluster's, the CLI user's): an exec plugin's token, a token file read again as it rotates,
a username and password; auth-provider is refused with a reason. A server on loopback
records each request's Authorization header."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from krypton.adapters.clientconfig import TokenFile, configuration_from_file
from krypton.adapters.kube import Kube
from krypton.decisions.errors import SettingsError


def kubeconfig(tmp_path: Path, server: str, user: dict[str, Any]) -> Path:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


async def authorizations(tmp_path: Path, user: dict[str, Any], requests: int = 1,
                         between: Any = None) -> list[str | None]:
    seen: list[str | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                found = [ln.split(":", 1)[1].strip() for ln in lines
                         if ln.lower().startswith("authorization:")]
                seen.append(found[0] if found else None)
                body = json.dumps({"gitVersion": "v1.34.4"}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    cfg = await configuration_from_file(str(kubeconfig(tmp_path, url, user)),
                                        workdir=tmp_path / "tls")
    kube = Kube(cfg, name="c")
    try:
        for i in range(requests):
            if i and between:
                between(cfg)
            assert await kube.server_version() == "v1.34.4"
    finally:
        await kube.close()
        server.close()
        await server.wait_closed()
    return seen


def test_an_exec_plugin_of_a_trusted_kubeconfig_gives_the_token(tmp_path: Path) -> None:
    script = tmp_path / "plugin"
    script.write_text("#!/bin/sh\necho run >> \"$(dirname \"$0\")/runs.log\"\n"
                      "printf '%s' '{\"apiVersion\": \"client.authentication.k8s.io/v1beta1\", "
                      "\"kind\": \"ExecCredential\", \"status\": {\"token\": \"from-plugin\"}}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    seen = asyncio.run(authorizations(tmp_path, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "./plugin"}},
        requests=3))
    assert seen == ["Bearer from-plugin"] * 3
    assert len((tmp_path / "runs.log").read_text().splitlines()) == 1  # kept, not run per request


def test_a_token_file_is_read_again_as_it_rotates(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")

    def rotate(cfg: Any) -> None:
        (tmp_path / "token").write_text("second\n")
        assert isinstance(cfg.credentials, TokenFile)
        cfg.credentials._read_at -= TokenFile.REREAD  # as a minute later

    seen = asyncio.run(authorizations(tmp_path, {"tokenFile": "token"}, requests=2,
                                      between=rotate))
    assert seen == ["Bearer first", "Bearer second"]


def test_a_username_and_password_go_as_basic_auth(tmp_path: Path) -> None:
    seen = asyncio.run(authorizations(tmp_path, {"username": "admin", "password": "s3cret"}))
    assert seen == ["Basic YWRtaW46czNjcmV0"]  # base64 of admin:s3cret


def test_an_auth_provider_is_refused_with_its_reason(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "https://127.0.0.1:1", {"auth-provider": {"name": "oidc"}})
    with pytest.raises(SettingsError, match="user.auth-provider.*exec credential plugin"):
        asyncio.run(configuration_from_file(str(path), workdir=tmp_path / "tls"))
