"""The guard of krypton's release records (SPEC S4): who may write them, enforced by the API
server itself. Pure: the manifests, and how what a cluster holds compares with them.

helm keeps a release's history as Secrets (or ConfigMaps) in the release's namespace and acts
on it with krypton's rights: an upgrade deletes what the current record lists and the chart
no longer renders, a rollback applies its target record, an uninstall runs the newest
record's hooks. Whoever may write in that namespace (a tenant's own admin) could write
records, and a check of the records made before helm reads them again races helm. So the
write itself is refused: a ValidatingAdmissionPolicy and its binding let only the identity
krypton acts as on the cluster (asked of the cluster: SelfSubjectReview) create, change or
delete a record of krypton's releases, and let Kubernetes' namespace controller delete them
with their namespace. A record of krypton's is a Secret or ConfigMap, in a namespace krypton
manages, that is (or was, for a change or a delete) named ``sh.helm.release.v1.tenant-...``
or labelled ``owner=helm`` with a release name ``tenant-...``. Other helm users, and other
namespaces, are not matched.

Once in force, the guard has a time: the API server's own clock (the creation time it gives
a dry-run object) after the probe was refused, kept on the binding (`SINCE_ANNOTATION`) with
the uid and generation of policy and binding, so that it holds only for these very objects.
A record created after it was written by krypton: nobody else could.

The policy also refuses one object nobody stores: a dry-run create of a ConfigMap labelled
`PROBE_LABEL` with the policy's own name (each instance's guard refuses its own probe only).
krypton sends it after installing or finding the policy; its refusal, naming the policy, is
how krypton knows the API server it speaks to enforces the guard.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from krypton.decisions.model import (
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OWNER_LABEL,
    epoch_seconds,
    rfc3339,
)

API_VERSION = "admissionregistration.k8s.io/v1"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
PROBE_LABEL = f"{GROUP}/guard-probe"
PROBE_NAME = "krypton-guard-probe"
SINCE_ANNOTATION = f"{GROUP}/guarded-since"
RECORD_PREFIX = "sh.helm.release.v1.tenant-"
RELEASE_PREFIX = "tenant-"
# Kubernetes' namespace controller, as kube-controller-manager runs it with and without
# --use-service-account-credentials: a deleted namespace finishes deleting, records included
NAMESPACE_CONTROLLERS = ("system:serviceaccount:kube-system:namespace-controller",
                         "system:kube-controller-manager")
DENIED = "release records of krypton's releases are written by krypton only"
PROBED = "krypton's guard probe: the release-record guard is in force"


def policy_name(watch_namespace: str) -> str:
    """One guard per krypton instance on a cluster: instances side by side (SPEC O5) each
    guard the records of their own Tenants."""
    return "krypton-release-records" + (f".{watch_namespace}" if watch_namespace else "")


def _cel(text: str) -> str:
    """A CEL string literal of `text` (JSON's escapes are CEL's)."""
    return json.dumps(text)


def _is_record(o: str) -> str:
    """CEL: the object `o` is a record of one of krypton's releases."""
    labels = f"{o}.metadata.labels"
    return (f"({o}.metadata.name.startsWith({_cel(RECORD_PREFIX)}) || "
            f"(has({labels}) && 'owner' in {labels} && {labels}['owner'] == 'helm' && "
            f"'name' in {labels} && {labels}['name'].startsWith({_cel(RELEASE_PREFIX)})))")


def _in_scope(watch_namespace: str, release_namespace: str | None) -> str:
    """CEL: the request's namespace holds releases of this krypton instance: the one
    release namespace, or a namespace krypton manages (for a namespaced instance, one of
    its own Tenants')."""
    if release_namespace:
        return f"namespaceObject.metadata.name == {_cel(release_namespace)}"
    labels = "namespaceObject.metadata.labels"
    scope = (f"has({labels}) && {_cel(MANAGED_BY_LABEL)} in {labels} && "
             f"{labels}[{_cel(MANAGED_BY_LABEL)}] == {_cel(MANAGED_BY)}")
    if watch_namespace:
        scope += (f" && {_cel(OWNER_LABEL)} in {labels} && "
                  f"{labels}[{_cel(OWNER_LABEL)}].startsWith({_cel(watch_namespace + '.')})")
    return scope


def _probe(name: str) -> str:
    """CEL: the object is the probe of the guard `name` (each instance's probe is refused by
    its own guard only)."""
    labels = "object.metadata.labels"
    return (f"(object != null && has(object.metadata) && has({labels}) && "
            f"{_cel(PROBE_LABEL)} in {labels} && {labels}[{_cel(PROBE_LABEL)}] == {_cel(name)})")


def manifests(user: str, *, watch_namespace: str = "",
              release_namespace: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy and its binding that let only `user` (and the namespace controller, to
    delete) write the release records of this krypton instance's releases."""
    name = policy_name(watch_namespace)
    labels = {MANAGED_BY_LABEL: MANAGED_BY}
    record = (f"((object != null && has(object.metadata) && {_is_record('object')}) || "
              f"(oldObject != null && has(oldObject.metadata) && {_is_record('oldObject')}))")
    controllers = ", ".join(_cel(u) for u in NAMESPACE_CONTROLLERS)
    policy = {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["secrets", "configmaps"],
                "operations": ["CREATE", "UPDATE", "DELETE"]}]},
            # namespaceObject is not known to match conditions: the namespace is judged
            # by the validation
            "matchConditions": [{"name": "krypton-release-record-or-probe",
                                 "expression": f"{_probe(name)} || {record}"}],
            "validations": [
                {"expression": f"!{_probe(name)}", "message": PROBED, "reason": "Forbidden"},
                {"expression": f"!({_in_scope(watch_namespace, release_namespace)}) || "
                               f"request.userInfo.username == {_cel(user)} || "
                               f"(request.operation == 'DELETE' && "
                               f"request.userInfo.username in [{controllers}])",
                 "message": f"{DENIED} ({user})", "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


def differs(want: Any, found: Any, at: str = "spec") -> str:
    """Where `found` (as the API server returns it, defaults filled in) departs from `want`:
    the first path whose value differs, "" when every field of `want` holds in `found`."""
    if isinstance(want, Mapping):
        if not isinstance(found, Mapping):
            return at
        for key, value in want.items():
            where = differs(value, found.get(key), f"{at}.{key}")
            if where:
                return where
        return ""
    if isinstance(want, list):
        if not isinstance(found, list) or len(found) != len(want):
            return at
        for i, (w, f) in enumerate(zip(want, found, strict=True)):
            where = differs(w, f, f"{at}[{i}]")
            if where:
                return where
        return ""
    return "" if want == found else at


def probe(namespace: str, watch_namespace: str) -> dict[str, Any]:
    """The ConfigMap whose dry-run create this instance's guard refuses when it is in force."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": PROBE_NAME, "namespace": namespace,
                         "labels": {PROBE_LABEL: policy_name(watch_namespace)}}}


def probe_refused(message: str, watch_namespace: str) -> bool:
    """Whether the API server's refusal of the probe is the guard's own: the policy named
    (the probe, krypton's own request and no record, can be refused by it for being the
    probe only; the message's end, which says so, may be cut short)."""
    return f"ValidatingAdmissionPolicy '{policy_name(watch_namespace)}'" in message


def held(policy: Mapping[str, Any], binding: Mapping[str, Any]) -> str:
    """What must not change for the guard to have held since a time: the uid and generation
    of the policy and of the binding (deleted and made again, or changed, starts anew)."""
    return "/".join(str((o.get("metadata") or {}).get(k, ""))
                    for o in (policy, binding) for k in ("uid", "generation"))


def keeps(key: str, which: int, obj: Mapping[str, Any]) -> bool:
    """Whether `obj`, the policy (`which` 0) or the binding (1) as a watch delivers it, is
    still the very object the guard held by `key` (:func:`held`) names: the same uid and
    generation. A change of its metadata alone (the time krypton records on the binding)
    or of its status keeps the guard; a change of its spec, or a new object, does not."""
    meta = obj.get("metadata") or {}
    parts = key.split("/")
    return len(parts) == 4 and parts[2 * which:2 * which + 2] == [
        str(meta.get("uid", "")), str(meta.get("generation", ""))]


def since(binding: Mapping[str, Any], key: str) -> float:
    """When the guard came into force, as recorded on `binding` for the objects `key`
    names; 0 when not recorded for them."""
    text = str(((binding.get("metadata") or {}).get("annotations") or {}).get(
        SINCE_ANNOTATION) or "")
    when, _, recorded = text.partition(" ")
    return (epoch_seconds(when) or 0.0) if recorded == key else 0.0


def changed_at(*objects: Mapping[str, Any]) -> float:
    """When the last of `objects` was made or changed, by the API server's clock: the latest
    of their creation times and of the times on their managed fields (0 when none is given)."""
    times = []
    for o in objects:
        meta = o.get("metadata") or {}
        times.append(meta.get("creationTimestamp"))
        fields = meta.get("managedFields")
        if isinstance(fields, list):
            times.extend(f.get("time") for f in fields if isinstance(f, Mapping))
    return max((epoch_seconds(t) or 0.0 for t in times), default=0.0)


def since_annotation(when: float, key: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {SINCE_ANNOTATION: f"{rfc3339(when)} {key}"}}}


def stamp(namespace: str) -> dict[str, Any]:
    """A ConfigMap whose dry-run create tells the API server's time (never stored)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"generateName": "krypton-guard-clock-", "namespace": namespace}}
