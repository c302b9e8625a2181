"""Helpers for integration tests: API clients per control plane, an isolated fleet per test.

Every test gets its own discovery namespace on home and its own Tenant namespace
(``--watch-namespace``) on each cluster, so operators of different tests never see each
other's objects although the control planes are shared by the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from krypton.testing import ControlPlane
from krypton.testing.operator import OperatorProcess, kubeconfig_secret, wait_for

GROUP, VERSION, PLURAL = "mesh.openkcm.io", "v1alpha1", "tenants"


@dataclass
class Cluster:
    """A control plane with API clients."""

    name: str
    cp: ControlPlane
    api: client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = config.new_client_from_config(config_file=str(self.cp.kubeconfig))

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def ensure_namespace(self, name: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def remove_guard(self, name: str) -> None:
        """Delete the release-record guard `name` (policy and binding) that an operator
        installed here, as an admin would (SPEC S4); absent is fine."""
        adm = client.AdmissionregistrationV1Api(self.api)
        for delete in (adm.delete_validating_admission_policy_binding,
                       adm.delete_validating_admission_policy):
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def create_tenant(self, namespace: str, name: str, spec: dict[str, Any] | None = None,
                      annotations: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Tenant",
                "metadata": {"name": name, "namespace": namespace,
                             "annotations": annotations or {}},
                "spec": spec or {}}
        return self.custom.create_namespaced_custom_object(  # type: ignore[no-any-return]
            GROUP, VERSION, namespace, PLURAL, body)

    def add_tenant(self, namespace: str, name: str, **kw: Any) -> None:
        """Create a Tenant, waiting for the CRD that the operator ensures on engagement.

        An attempt whose answer is lost (a dropped connection, a server timeout) may still
        have created the Tenant: a conflict after such an attempt is this helper's own
        Tenant; any other conflict is a name taken before it."""
        errors: list[Exception] = []  # every failed attempt, in order

        def create() -> bool:
            try:
                self.create_tenant(namespace, name, **kw)
            except ApiException as exc:
                lost = any(not isinstance(e, ApiException) or e.status >= 500 for e in errors)
                if exc.status != 409 or not lost:
                    errors.append(exc)
                    raise
            except Exception as exc:
                errors.append(exc)
                raise
            return True

        try:
            wait_for(create, 60, what=f"Tenant CRD on {self.name}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the first errors: {errors[:3]!r}") from None

    def tenant(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            GROUP, VERSION, namespace, PLURAL, name)

    def tenant_gone(self, namespace: str, name: str) -> bool:
        try:
            self.tenant(namespace, name)
        except ApiException as exc:
            return exc.status == 404
        return False

    def patch_tenant(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        for c in (self.tenant(namespace, name).get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return c  # type: ignore[no-any-return]
        return None

    def phase(self, namespace: str, name: str) -> str | None:
        return (self.tenant(namespace, name).get("status") or {}).get("phase")

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float = 90) -> None:
        wait_for(lambda: self.phase(namespace, name) == phase, timeout,
                 what=f"{self.name} tenant {namespace}/{name} phase {phase}")

    def wait_condition(self, namespace: str, name: str, type_: str, status: str,
                       reason: str | None = None, timeout: float = 90) -> dict[str, Any]:
        def match() -> dict[str, Any] | None:
            c = self.condition(namespace, name, type_)
            if c and c["status"] == status and (reason is None or c["reason"] == reason):
                return c
            return None
        return wait_for(match, timeout, what=f"{self.name} {namespace}/{name} {type_}={status}"
                        f" {reason or ''}")

    def release_records(self, namespace: str, release: str) -> list[tuple[int, str]]:
        items = self.core.list_namespaced_secret(
            namespace, label_selector=f"owner=helm,name={release}").items
        return sorted((int(s.metadata.labels["version"]), s.metadata.labels["status"])
                      for s in items)

    def events(self, namespace: str, name: str | None = None) -> list[Any]:
        items = self.core.list_namespaced_event(namespace).items
        return [e for e in items if name is None or e.involved_object.name == name]

    def wait_event(self, namespace: str, name: str, reason: str, timeout: float = 30) -> Any:
        """The first Event about `name` with `reason` (Events are written after the status
        they explain, so a test that saw the status must still wait for them)."""
        return wait_for(lambda: next((e for e in self.events(namespace, name)
                                      if e.reason == reason), None),
                        timeout, what=f"{self.name} event {reason} on {namespace}/{name}")


@pytest.fixture(scope="session")
def home_cluster(home: ControlPlane) -> Cluster:
    return Cluster("home", home)


@pytest.fixture(scope="session")
def remote_cluster(remote: ControlPlane) -> Cluster:
    return Cluster("remote", remote)


@dataclass
class Fleet:
    """One test's slice of the test bed: discovery namespace, Tenant namespace, operators."""

    home: Cluster
    remote: Cluster
    chart_repo: Any
    testbin: Path
    discovery_ns: str
    tenant_ns: str
    operators: list[OperatorProcess] = field(default_factory=list)

    def register(self, name: str, cluster: Cluster | None = None, *,
                 kubeconfig: str | None = None, values: str | None = None) -> None:
        text = kubeconfig if kubeconfig is not None else cluster.cp.kubeconfig.read_text()  # type: ignore[union-attr]
        self.home.core.create_namespaced_secret(
            self.discovery_ns, kubeconfig_secret(name, text, namespace=self.discovery_ns,
                                                 values=values))

    def unregister(self, name: str) -> None:
        self.home.core.delete_namespaced_secret(name, self.discovery_ns)

    def args(self, *extra: str, version: str = "0.2.0", chart: str = "sample") -> list[str]:
        return [
            "--watch-kubeconfig", str(self.home.cp.kubeconfig),
            "--namespace", self.discovery_ns,
            "--watch-namespace", self.tenant_ns,
            "--chart-repo", self.chart_repo.url,
            "--chart-name", chart,
            "--chart-version", version,
            "--no-self-cluster",
            "--helm-timeout", "60s",
            "--resync-period", "600s",
            *extra,
        ]

    def start(self, *extra: str, version: str = "0.2.0", chart: str = "sample",
              env: dict[str, str] | None = None, wait: bool = True) -> OperatorProcess:
        op = OperatorProcess(self.args(*extra, version=version, chart=chart),
                             helm_dir=self.testbin, env=env)
        self.operators.append(op)
        op.start()
        if wait:
            op.wait_ready()
        return op

    def tenant(self, cluster: Cluster, name: str, **kw: Any) -> str:
        """Create a Tenant in this test's namespace (see `Cluster.add_tenant`)."""
        cluster.add_tenant(self.tenant_ns, name, **kw)
        return name

    def refused_tenant(self, cluster: Cluster, prefix: str) -> str:
        """A Tenant whose namespace exists and was not made by krypton, once refused for
        it (R16: NamespaceConflict, "not created by krypton")."""
        name = unique(prefix)
        cluster.core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
        self.tenant(cluster, name)
        c = cluster.wait_condition(self.tenant_ns, name, f"ClusterError/{cluster.name}",
                                   "True", "NamespaceConflict")
        assert "not created by krypton" in c["message"]
        # the pass writes its Events after the status; its last one is waited for, so that
        # a test counting writes from here does not count the refusal's own
        cluster.wait_event(self.tenant_ns, name, "NamespaceConflict")
        return name


@pytest.fixture
def fleet(home_cluster: Cluster, remote_cluster: Cluster, chart_repo: Any,
          testbin: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    suffix = uuid.uuid4().hex[:6]
    f = Fleet(home_cluster, remote_cluster, chart_repo, testbin, f"disc-{suffix}", f"t-{suffix}")
    home_cluster.ensure_namespace(f.discovery_ns)
    for c in (home_cluster, remote_cluster):
        c.ensure_namespace(f.tenant_ns)
    yield f
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    for op in f.operators:
        op.stop()
        if failed:
            print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")
    for c in (home_cluster, remote_cluster):  # the guard its operators installed (SPEC S4)
        c.remove_guard(f"krypton-release-records.{f.tenant_ns}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


Waiter = Callable[..., Any]
