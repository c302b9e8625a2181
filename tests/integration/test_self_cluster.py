"""D6: the self-cluster Secret from the user's kubeconfig (strategy C)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from krypton.testing.operator import OperatorProcess, wait_for

from .conftest import Fleet, unique


def test_self_cluster_secret_is_inlined_reduced_and_engaged(fleet: Fleet, tmp_path: Path) -> None:
    # A user kubeconfig with file references and a second context, as people have them.
    doc = yaml.safe_load(fleet.home.cp.kubeconfig.read_text())
    user = doc["users"][0]["user"]
    cluster = doc["clusters"][0]["cluster"]
    for field, name in (("client-certificate-data", "client.crt"), ("client-key-data", "client.key")):
        (tmp_path / name).write_bytes(base64.b64decode(user.pop(field)))
        user[field.removesuffix("-data")] = name  # relative path
    (tmp_path / "ca.crt").write_bytes(base64.b64decode(cluster.pop("certificate-authority-data")))
    cluster["certificate-authority"] = str(tmp_path / "ca.crt")
    doc["contexts"].append({"name": "elsewhere", "context": {"cluster": "home", "user": "nobody"}})
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump(doc))

    args = [a for a in fleet.args() if a != "--no-self-cluster"]
    op = OperatorProcess(args, helm_dir=fleet.testbin, env={"KUBECONFIG": str(kubeconfig)})
    fleet.operators.append(op)
    op.start().wait_ready()
    secret = wait_for(lambda: fleet.home.core.read_namespaced_secret("self-cluster",
                                                                     fleet.discovery_ns), 30)
    assert secret.metadata.labels["sigs.k8s.io/multicluster-runtime-kubeconfig"] == "true"
    stored = yaml.safe_load(base64.b64decode(secret.data["kubeconfig"]))
    assert [c["name"] for c in stored["contexts"]] == ["home"]
    assert set(stored["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}
    assert "certificate-authority-data" in stored["clusters"][0]["cluster"]
    name = fleet.tenant(fleet.home, unique("self"))
    fleet.home.wait_phase(fleet.tenant_ns, name, "Ready")
    assert fleet.home.condition(fleet.tenant_ns, name, "ClusterReady/self-cluster")

    # A valid existing Secret is kept as it is on the next start.
    rv = secret.metadata.resource_version
    op.stop()
    again = OperatorProcess(args, helm_dir=fleet.testbin, env={"KUBECONFIG": str(kubeconfig)})
    fleet.operators.append(again)
    again.start().wait_ready()
    assert fleet.home.core.read_namespaced_secret("self-cluster", fleet.discovery_ns) \
        .metadata.resource_version == rv
