"""``krypton register-cluster`` (SPEC O7): a kubeconfig inlined, reduced and checked as the
operator checks it (D4/D5), its server probed, and the labelled Secret written."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

from krypton.adapters.clientconfig import configuration_for
from krypton.adapters.kube import Kube
from krypton.app.config import file_reader
from krypton.app.home import watch_cluster
from krypton.decisions.clusters import kubeconfig as kubeconfigs
from krypton.decisions.errors import ClusterExists, KubeconfigRejected
from krypton.decisions.settings import Settings
from krypton.decisions.trust import safeyaml


async def register_cluster(settings: Settings, name: str, kubeconfig_path: str,
                           context: str | None, values_path: str | None, *,
                           overwrite: bool = False) -> str:
    """Inline, reduce and check a kubeconfig, probe its server, write the labelled Secret.
    An existing Secret of that name is replaced only with `overwrite` (PermanentError
    otherwise), and the result says which server it pointed at before."""
    path = Path(kubeconfig_path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeconfigRejected(f"cannot read {path}: {exc.strerror}") from exc
    inlined = kubeconfigs.inline_files(text, file_reader(str(path.parent)))
    kc = kubeconfigs.parse(inlined, context=context)
    with tempfile.TemporaryDirectory(prefix="krypton-register-") as tmp:
        home = await watch_cluster(settings, Path(tmp), trust_secret=False)
        try:
            existing = await home.get_secret(settings.namespace, name)
            if existing is not None and not overwrite:
                raise ClusterExists(
                    f"Secret {settings.namespace}/{name} exists (cluster {name}, server "
                    f"{_server_of(existing, settings.kubeconfig_key)}); --overwrite replaces "
                    f"it with server {kc.server}")
            probe = Kube(await configuration_for(kc, Path(tmp)), name=name,
                         timeout=settings.api_timeout)
            try:
                version = await probe.server_version()
            finally:
                await probe.close()
            data = {settings.kubeconfig_key: base64.b64encode(kc.to_yaml().encode()).decode()}
            if values_path:
                data["values.yaml"] = _values_file(values_path)
            verb = await _write_cluster_secret(home, settings, name, data, existing)
        finally:
            await home.close()
    if existing is not None:
        verb += (f" (server before: {_server_of(existing, settings.kubeconfig_key)}, "
                 f"after: {kc.server})")
    warn = "".join(f"\nwarning: {w}" for w in kc.warnings)
    return (f"cluster {name} ({kc.server}, {version}) registered: Secret "
            f"{settings.namespace}/{name} {verb}{warn}")


def _server_of(secret: dict[str, Any], key: str) -> str:
    """The API server a cluster Secret's kubeconfig names (read, never used)."""
    from krypton.decisions.clusters.discovery import decode_data

    try:
        raw = decode_data((secret.get("data") or {}).get(key))
        return kubeconfigs.parse(raw, trust=True).server
    except (KubeconfigRejected, ValueError) as exc:
        return f"unreadable ({exc})"


def _values_file(values_path: str) -> str:
    try:
        raw = Path(values_path).read_bytes()
        safeyaml.load_values(raw, what=values_path)
    except OSError as exc:
        raise KubeconfigRejected(f"cannot read {values_path}: {exc.strerror}",
                                 reason="ValuesInvalid") from exc
    except safeyaml.YamlRejected as exc:
        raise KubeconfigRejected(str(exc), reason="ValuesInvalid") from exc
    return base64.b64encode(raw).decode()


async def _write_cluster_secret(home: Kube, settings: Settings, name: str,
                                data: dict[str, str], existing: dict[str, Any] | None) -> str:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": settings.namespace,
                     "labels": {settings.kubeconfig_label: "true",
                                "app.kubernetes.io/managed-by": "krypton"}},
        "type": "Opaque", "data": data}
    if existing is None:
        await home.create_secret(settings.namespace, body)
        return "created"
    # replaced only as it was judged: a Secret changed since is a conflict, not overwritten
    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
    await home.replace_secret(settings.namespace, name, body)
    return "replaced"


