"""Bearer tokens from exec credential plugins (:mod:`krypton.decisions.clusters.execplugins`): a
ClusterProfile provider's of the admin's providers file, a trusted kubeconfig's ``user.exec``.

A plugin runs with the cluster info in ``KUBERNETES_EXEC_INFO`` (when it asks for it), its
environment the operator's plus its own ExecConfig's, nothing on stdin, in a
session of its own. It is bounded: an answer within :data:`TIMEOUT` seconds and
:data:`execplugins.MAX_OUTPUT` bytes, or it is killed and the run failed. A token is kept
until four fifths of its life are over (five minutes when the plugin gives no expiry), then
the plugin runs again. A failed run is retried on a growing schedule, never per
request: meanwhile requests fail with the last error (CredentialPluginFailed) while no
token is left valid. Neither the token nor the plugin's output is ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import structlog

from krypton.adapters import metrics
from krypton.decisions import retry
from krypton.decisions.clusters import execplugins
from krypton.decisions.clusters.execplugins import CredentialPluginFailed, PluginAccess

TIMEOUT = 30.0  # seconds a plugin may take to answer
NO_EXPIRY = 300.0  # seconds a token without an expirationTimestamp is used
REJECTED_AFTER = 10.0  # seconds a token refused by the server is still kept
FAILURES = retry.Policy(first=2.0, cap=300.0, jitter=0.1)  # a failing plugin's next run

log = structlog.get_logger("krypton.credentials")


class ExecCredentials:
    """The bearer token of one cluster, from its provider's plugin."""

    def __init__(self, access: PluginAccess, cluster: str, *, timeout: float = TIMEOUT) -> None:
        self.access, self.cluster, self.timeout = access, cluster, timeout
        self._token = ""
        self._renew_at = 0.0  # when the plugin runs again
        self._obtained = 0.0  # when the token came
        self._why = "first"  # why the plugin runs next: first, expiring, refused
        self._expires: float | None = None
        self._failures = 0
        self._next_run = 0.0
        self._error = ""
        self._lock = asyncio.Lock()

    async def authorization(self) -> str:
        """The Authorization header of the next request."""
        return f"Bearer {await self.token()}"

    def rejected(self) -> None:
        """The server refused the token (revoked, or its cluster's keys rotated): a request
        REJECTED_AFTER seconds or more after the token came runs the plugin again (a server
        refusing every token gets one run per that time, not one per request)."""
        if self._obtained + REJECTED_AFTER < self._renew_at:
            self._renew_at, self._why = self._obtained + REJECTED_AFTER, "refused"

    async def token(self) -> str:
        if self._token and time.time() < self._renew_at:
            return self._token
        async with self._lock:
            now = time.time()
            if self._token and now < self._renew_at:
                return self._token
            if self._failures and now < self._next_run:
                if self._token and (self._expires is None or now < self._expires):
                    return self._token  # the old one still works
                raise CredentialPluginFailed(
                    f"{self._error}; the plugin runs again in {self._next_run - now:.0f}s")
            try:
                token, expires = await self._run()
            except CredentialPluginFailed as exc:
                self._failures += 1
                self._next_run = now + FAILURES.delay(self._failures)
                self._error = f"credential plugin of provider {self.access.provider.name!r}: {exc}"
                metrics.CREDENTIAL_PLUGIN_RUNS.labels(self.cluster, "failed", self._why).inc()
                log.warning("credential plugin failed", cluster=self.cluster,
                            provider=self.access.provider.name, error=str(exc),
                            retry_in=round(self._next_run - now, 1))
                raise CredentialPluginFailed(self._error) from None
            metrics.CREDENTIAL_PLUGIN_RUNS.labels(self.cluster, "ok", self._why).inc()
            self._why = "expiring"
            self._token, self._expires, self._failures = token, expires, 0
            self._obtained = now
            self._renew_at = now + (NO_EXPIRY if expires is None else 0.8 * (expires - now))
            return token

    async def _run(self) -> tuple[str, float | None]:
        provider = self.access.provider
        env = {**os.environ, **dict(provider.env),
               "KUBERNETES_EXEC_INFO": execplugins.exec_info(self.access)}
        try:
            proc = await asyncio.create_subprocess_exec(
                provider.command, *provider.args, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True)
        except OSError as exc:
            raise CredentialPluginFailed(f"cannot run {provider.command}: "
                                         f"{exc.strerror or type(exc).__name__}") from None
        assert proc.stdout is not None
        answered = False
        try:
            async with asyncio.timeout(self.timeout):
                chunks: list[bytes] = []
                while chunk := await proc.stdout.read(1 << 16):
                    chunks.append(chunk)
                    if sum(map(len, chunks)) > execplugins.MAX_OUTPUT:
                        raise CredentialPluginFailed(
                            f"its answer is over {execplugins.MAX_OUTPUT} bytes")
                output = b"".join(chunks)
                code = await proc.wait()
                answered = True
        except TimeoutError:
            raise CredentialPluginFailed(f"no answer within {self.timeout:.0f}s") from None
        finally:
            if not answered:  # the whole session: a child holding the pipe goes too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.communicate()  # the pipe's end, with nobody left to write
        if code != 0:
            raise CredentialPluginFailed(f"it exited with status {code}")
        return execplugins.credential(output, time.time(), provider.api_version)
