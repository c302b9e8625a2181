"""The watch (home) cluster: where Tenants, cluster Secrets and the Lease live (SPEC D7).
Shared by the operator and the CLI, which must not import the operator's runtime to find it.
"""

from __future__ import annotations

import os
from pathlib import Path

from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import (
    HOME,
    configuration_for,
    configuration_from_file,
    configuration_in_cluster,
)
from krypton.decisions import kubeconfig as kubeconfigs
from krypton.decisions import redact
from krypton.decisions.errors import KubeconfigRejected, SettingsError
from krypton.decisions.settings import Settings


def user_kubeconfig_path() -> str:
    first = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    return first or os.path.expanduser("~/.kube/config")


def context_namespace(settings: Settings) -> str | None:
    """The namespace of the kube context the CLI uses to reach the watch cluster
    (--watch-kubeconfig and --watch-context, else $KUBECONFIG / ~/.kube/config and its
    current context), or the pod's own namespace in a pod; None when it names none."""
    path = settings.watch_kubeconfig or None
    if path is None and configuration_in_cluster() is not None:
        try:
            return Path(kubeconfigs.SA_NAMESPACE).read_text().strip() or None
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
        from krypton.decisions.discovery import decode_data

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
