"""The watch (home) cluster: where Tenants, cluster Secrets and the Lease live (SPEC D7).
Shared by the operator and the CLI, which must not import the operator's runtime to find it.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import structlog

from krypton.adapters.clientconfig import (
    configuration_for,
    configuration_from_file,
    configuration_in_cluster,
)
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import HOME, Obj
from krypton.app.config import file_reader
from krypton.decisions.clusters import incluster
from krypton.decisions.clusters import kubeconfig as kubeconfigs
from krypton.decisions.clusters.discovery import SELF_CLUSTER, decode_data
from krypton.decisions.errors import (
    AlreadyExists,
    KryptonError,
    KubeconfigRejected,
    SettingsError,
    TemporaryError,
)
from krypton.decisions.settings import Settings
from krypton.decisions.trust import records, redact

log = structlog.get_logger("krypton")
RECORD_KEY_SECRET = "krypton-record-key"


def user_kubeconfig_path() -> str:
    """$KUBECONFIG, else ~/.kube/config. client-go merges the files of a $KUBECONFIG list
    (the first to name an entry wins); krypton reads one file, so a list is refused with
    the command that merges it (SettingsError) rather than read otherwise than kubectl."""
    listed = [p for p in (os.environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    if len(listed) > 1:
        raise SettingsError(f"$KUBECONFIG lists {len(listed)} files, which client-go merges "
                            "and krypton does not: merge them (kubectl config view --flatten "
                            "> FILE) and set KUBECONFIG=FILE, or name one with "
                            "--watch-kubeconfig")
    return listed[0] if listed else os.path.expanduser("~/.kube/config")


def context_namespace(settings: Settings) -> str | None:
    """The namespace of the kube context the CLI uses to reach the watch cluster
    (--watch-kubeconfig and --watch-context, else $KUBECONFIG / ~/.kube/config and its
    current context), or the pod's own namespace in a pod; None when it names none."""
    path = settings.watch_kubeconfig or None
    if path is None and configuration_in_cluster() is not None:
        try:
            return Path(incluster.SA_NAMESPACE).read_text().strip() or None
        except OSError:
            return None
    try:
        # the user's own file: read (trusted), never used to reach anything here
        kc = kubeconfigs.parse(Path(path or user_kubeconfig_path()).read_bytes(),
                               context=settings.watch_context or None, trust=True)
    except (OSError, KubeconfigRejected):
        return None
    namespace = kc.config["contexts"][0]["context"].get("namespace")
    return str(namespace) if namespace else None


async def watch_cluster(settings: Settings, workdir: Path, *, trust_secret: bool = True) -> Kube:
    """The home cluster, in the order of SPEC D7.

    A kubeconfig read from --watch-kubeconfig-secret is trusted (exec plugins, file
    references) only with `trust_secret`: the operator's own Secret, named by whoever
    installed it. The CLI passes False: it runs on an administrator's machine, where a
    credential plugin or a file named by a Secret would run or be read as that person.

    A configuration that cannot work (no kubeconfig at all, a missing or garbage file, a
    missing Secret or key) raises SettingsError: one line, exit status 2 (SPEC O1). An API
    server that does not answer is a TemporaryError, retried by the caller.
    """
    timeout = settings.api_timeout
    if settings.watch_kubeconfig_secret:
        local_cfg = configuration_in_cluster()
        if local_cfg is None:
            local_cfg = await configuration_from_file(
                user_kubeconfig_path(), what="kubeconfig (to read the watch Secret)",
                workdir=workdir / "local")
        local = Kube(local_cfg, name="local", timeout=timeout)
        namespace = settings.watch_kubeconfig_secret_namespace or settings.namespace
        ref = f"{namespace}/{settings.watch_kubeconfig_secret}"
        try:
            secret = await local.get_secret(namespace, settings.watch_kubeconfig_secret)
        finally:
            await local.close()
        if secret is None:
            raise SettingsError(f"invalid --watch-kubeconfig-secret: Secret {ref} not found")
        from krypton.decisions.clusters.discovery import decode_data

        key = settings.watch_kubeconfig_secret_key
        raw = decode_data((secret.get("data") or {}).get(key))
        try:
            kc = kubeconfigs.parse(raw, context=settings.watch_context or None,
                                   trust=trust_secret)
            cfg = await configuration_for(kc, workdir / "watch", trust=trust_secret)
        except KubeconfigRejected as exc:
            raise SettingsError(f"invalid --watch-kubeconfig-secret: key {key!r} of Secret "
                                f"{ref}: {exc}") from exc
        except (ValueError, OSError) as exc:
            raise SettingsError(f"invalid --watch-kubeconfig-secret: Secret {ref}: "
                                f"{redact.describe(exc)}") from exc
        return Kube(cfg, name="home", timeout=timeout, limits=HOME)
    if settings.watch_kubeconfig:
        return Kube(await configuration_from_file(settings.watch_kubeconfig,
                                                  settings.watch_context,
                                                  what="invalid --watch-kubeconfig:",
                                                  workdir=workdir / "watch"),
                    name="home", timeout=timeout, limits=HOME)
    in_cluster = configuration_in_cluster()
    if in_cluster is not None:
        return Kube(in_cluster, name="home", timeout=timeout, limits=HOME)
    path = user_kubeconfig_path()
    if not os.path.isfile(path):
        raise SettingsError(f"no watch cluster: not in a pod and no kubeconfig at {path} "
                            "(set --watch-kubeconfig or $KUBECONFIG)")
    return Kube(await configuration_from_file(path, settings.watch_context,
                                              workdir=workdir / "watch"),
                name="home", timeout=timeout, limits=HOME)


async def record_keys(home: Kube, namespace: str) -> tuple[records.Keys, Obj] | None:
    """The keys that seal and check krypton's release records, and their Secret; None when
    the Secret is absent."""
    existing = await home.get_secret(namespace, RECORD_KEY_SECRET)
    if existing is None:
        return None
    try:
        return records.keys_of(existing.get("data") or {}), existing
    except ValueError as exc:
        raise SettingsError(f"Secret {namespace}/{RECORD_KEY_SECRET} {exc}; delete it and "
                            "krypton makes a new one: the seals of the old key then hold no "
                            "more (see the docs' security model, Release records)") from None


async def ensure_record_key(home: Kube, namespace: str) -> records.Keys:
    """The keys that seal and check krypton's release records (SPEC S3, S4), from the Secret
    ``krypton-record-key`` in the discovery namespace (``key``, and the keys retired by
    ``krypton rotate-record-key``), created with a random key when absent (several replicas
    may race: the Secret that was created first is every one's). Only who may read Secrets
    there, who already holds every cluster's credentials, can read it."""
    for _ in range(2):
        found = await record_keys(home, namespace)
        if found is not None:
            return found[0]
        body = {"metadata": {"name": RECORD_KEY_SECRET, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "krypton"}},
                "type": "Opaque",
                "data": {"key": base64.b64encode(os.urandom(records.KEY_BYTES)).decode()}}
        try:
            await home.create_secret(namespace, body)
            log.info("release record key created", secret=f"{namespace}/{RECORD_KEY_SECRET}")
        except AlreadyExists:
            continue
    raise TemporaryError(f"Secret {namespace}/{RECORD_KEY_SECRET} could not be read back")


async def ensure_self_cluster(home: Kube, settings: Settings) -> None:
    """Create the labelled ``self-cluster`` Secret unless a valid one exists (SPEC D6)."""
    ns = settings.namespace
    existing = await home.get_secret(ns, SELF_CLUSTER)
    if existing is not None:
        labels = (existing.get("metadata") or {}).get("labels") or {}
        raw = decode_data((existing.get("data") or {}).get(settings.kubeconfig_key))
        try:
            kubeconfigs.parse(raw, trust=settings.trust_kubeconfig_secrets, allow_in_cluster=True,
                              pod_server=settings.pod_server)
            if labels.get(settings.kubeconfig_label) == "true":
                log.info("self-cluster secret present", namespace=ns)
                return
        except KubeconfigRejected:
            pass
    try:
        content = await _self_kubeconfig(home, settings.pod_server)
    except KryptonError as exc:
        log.warning("self-cluster secret not created", error=str(exc))
        return

    body: dict[str, Any] = {
        "metadata": {"name": SELF_CLUSTER, "namespace": ns,
                     "labels": {settings.kubeconfig_label: "true",
                                "app.kubernetes.io/managed-by": "krypton"}},
        "type": "Opaque",
        "data": {settings.kubeconfig_key: base64.b64encode(content.encode()).decode()},
    }
    if existing is None:
        await home.create_secret(ns, body)
    else:
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        await home.replace_secret(ns, SELF_CLUSTER, body)
    log.info("self-cluster secret written", namespace=ns)


async def _self_kubeconfig(home: Kube, pod_server: str) -> str:
    """Strategy C: inline and reduce the user kubeconfig, validate, else fall back."""
    path = user_kubeconfig_path()
    if not os.path.exists(path):
        if configuration_in_cluster() is not None:
            # In a pod: reference the rotating service-account token, never copy it.
            return incluster.in_cluster_kubeconfig(SELF_CLUSTER, pod_server)
        return synthesize_kubeconfig(home)
    text = Path(path).read_text()
    inlined = kubeconfigs.inline_files(text, file_reader(os.path.dirname(path)))
    try:
        reduced = kubeconfigs.parse(inlined, trust=True)
        with tempfile.TemporaryDirectory(prefix="krypton-probe-") as scratch:
            probe = Kube(await configuration_for(reduced, Path(scratch), trust=True),
                         name="self-probe", timeout=10)
            try:
                await probe.server_version()
            finally:
                await probe.close()
        return reduced.to_yaml()
    except KryptonError as exc:
        log.warning("reduced self kubeconfig failed validation; using the full file",
                    error=str(exc))
        return inlined


def synthesize_kubeconfig(home: Kube) -> str:
    """A minimal kubeconfig from the process's own client configuration."""

    import yaml

    cfg = home.config
    cluster: dict[str, Any] = {"server": cfg.host}
    if cfg.ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(cfg.ca_pem).decode()
    user: dict[str, Any] = {}
    if cfg.token:
        user["token"] = cfg.token
    if cfg.cert_file and cfg.key_file:
        user["client-certificate-data"] = base64.b64encode(Path(cfg.cert_file).read_bytes()).decode()
        user["client-key-data"] = base64.b64encode(Path(cfg.key_file).read_bytes()).decode()
    return str(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": SELF_CLUSTER, "cluster": cluster}],
        "users": [{"name": SELF_CLUSTER, "user": user}],
        "contexts": [{"name": SELF_CLUSTER, "context": {"cluster": SELF_CLUSTER,
                                                         "user": SELF_CLUSTER}}],
        "current-context": SELF_CLUSTER,
    }, sort_keys=False))

