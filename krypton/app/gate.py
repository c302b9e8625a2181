"""The progressive rollout's metric gate (F7), as the operator builds it at start."""

from __future__ import annotations

import structlog

from krypton.adapters.kube import Kube
from krypton.adapters.prometheus import Prometheus, QueryRejected, ServerAuth
from krypton.decisions.clusters.discovery import secret_strings
from krypton.decisions.errors import KryptonError, SettingsError, TemporaryError
from krypton.decisions.rollouts import gates
from krypton.decisions.rollouts.rollout import Policy
from krypton.decisions.settings import Settings
from krypton.decisions.trust import redact
from krypton.runtime.rollout_controller import MetricGate

log = structlog.get_logger("krypton")


async def metric_gate(s: Settings, home: Kube) -> MetricGate | None:
    """The rollout's metric gate (F7), its query checked by the server's own parser:
    a query it cannot parse is a bad flag (exit 2). A server that cannot be asked now
    is said in the log; the gate then waits for its answers."""
    if not s.rollout_gate_query:
        return None
    server = Prometheus(s.rollout_gate_prometheus, ca_file=s.rollout_gate_ca_file)
    name, namespace = s.rollout_gate_credentials_secret, s.namespace

    async def auth() -> ServerAuth | None:
        if not name:
            return None
        secret = await home.get_secret(namespace, name)
        if secret is None:
            raise TemporaryError(f"metrics server credentials Secret {namespace}/{name} "
                                 "not found")
        data = secret_strings(secret)
        redact.register(data.get("password"), data.get("token"))
        return ServerAuth(data.get("username", ""), data.get("password", ""),
                          data.get("token", ""))

    example = next(iter(Policy.from_settings(s).canaries), "krypton")
    try:
        credentials = await auth()
    except KryptonError as exc:
        log.warning("metric gate query not checked", reason=exc.message)
        credentials = None
    try:
        why = await server.check(gates.query_for(s.rollout_gate_query, example),
                                 credentials)
    except QueryRejected as exc:
        raise SettingsError(f"invalid --rollout-gate-query: the server cannot parse it: "
                            f"{exc}") from exc
    if why:
        log.warning("metric gate query not checked", reason=why)
    return MetricGate(server, s.rollout_gate_query, s.rollout_gate_interval, auth)
