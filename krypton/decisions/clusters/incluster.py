"""The pod's own service account as a cluster's credentials (SPEC D6): where a pod finds its
API server and the files it is given, and the one kubeconfig that may name those files
without --trust-kubeconfig-secrets. No network."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_TOKEN, SA_CA = f"{SA_DIR}/token", f"{SA_DIR}/ca.crt"
SA_NAMESPACE = f"{SA_DIR}/namespace"
IN_CLUSTER_SERVERS = ("https://kubernetes.default.svc", "https://kubernetes.default.svc.cluster.local")


def service_server(env: Mapping[str, str]) -> str:
    """The API server a pod reaches through its environment `env`, as the in-cluster client
    configuration finds it (``KUBERNETES_SERVICE_HOST``/``_PORT``); "" outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not port.isdigit():
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


def uses_service_account(cluster: dict[str, Any], user: dict[str, Any], server: str,
                   pod_server: str) -> bool:
    """The service-account files of the pod, used only against the in-cluster API server.

    Such a kubeconfig cannot send the token anywhere else, and reading the token file on
    every use keeps it working across token rotation (SPEC D6).
    """
    return ((server in IN_CLUSTER_SERVERS or (pod_server != "" and server == pod_server))
            and cluster.get("certificate-authority") == SA_CA
            and set(user) == {"tokenFile"} and user["tokenFile"] == SA_TOKEN)


def in_cluster_kubeconfig(name: str, pod_server: str) -> str:
    """A kubeconfig that uses the pod's service account by reference, never by copy.

    The server is `pod_server`, the one the pod's environment names (:func:`service_server`),
    so that helm reaches it the way the operator's own client does (also in pods without
    cluster DNS or on the host network).
    """
    return str(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": pod_server or IN_CLUSTER_SERVERS[0],
                                                "certificate-authority": SA_CA}}],
        "users": [{"name": name, "user": {"tokenFile": SA_TOKEN}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }, sort_keys=False))
