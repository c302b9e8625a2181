"""Which objects of a chart every release claims alike (ownership.shared_candidates)."""

from __future__ import annotations

from typing import Any

from krypton.decisions.charts.ownership import ObjectRef, shared_candidates


def _obj(kind: str, name: str, namespace: str | None = None, *, api: str = "v1",
         hook: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if hook:
        meta["annotations"] = {"helm.sh/hook": "post-install"}
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def _render(release: str) -> list[Any]:
    """What a chart like ingress-nginx renders for `release` in namespace `release`."""
    return [
        _obj("Deployment", f"{release}-controller", api="apps/v1"),  # named after the release
        _obj("ConfigMap", "settings"),  # fixed name, no namespace: lands in each release's own
        _obj("ServiceAccount", "web", release),  # templated namespace
        _obj("IngressClass", "nginx", api="networking.k8s.io/v1"),  # fixed, cluster-scoped
        _obj("ClusterRole", f"{release}-reader", api="rbac.authorization.k8s.io/v1"),
        _obj("ConfigMap", "fleet-wide", "kube-public"),  # a fixed namespace
        _obj("Job", "smoke", api="batch/v1", hook=True),  # hooks carry no owner
        None, "text", {"kind": "List"},  # not objects
    ]


def test_objects_alike_for_two_releases_are_candidates() -> None:
    found = shared_candidates(_render("krypton-probe-a"), _render("krypton-probe-b"))
    assert found == (ObjectRef("v1", "ConfigMap", "settings", None),
                     ObjectRef("networking.k8s.io/v1", "IngressClass", "nginx", None),
                     ObjectRef("v1", "ConfigMap", "fleet-wide", "kube-public"))


def test_a_chart_named_after_its_release_has_none() -> None:
    def render(release: str) -> list[Any]:
        return [_obj("ClusterRole", f"{release}-reader", api="rbac.authorization.k8s.io/v1"),
                _obj("Service", release, release)]
    assert shared_candidates(render("a"), render("b")) == ()


def test_objects_the_manifest_keeps_are_not_checked_before_an_uninstall() -> None:
    from krypton.decisions.charts.ownership import kept

    keep = _obj("CustomResourceDefinition", "x.example.io", api="apiextensions.k8s.io/v1")
    keep["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
    assert kept(keep)
    assert not kept(_obj("ConfigMap", "c")) and not kept(None) and not kept("text")
