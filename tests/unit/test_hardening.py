"""Pure pieces of the hardening work: bounded YAML, redaction, ownership, helm's
errors, the cached objects' forms."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from krypton.adapters.chartarchive import _safe_component
from krypton.adapters.charts import index_versions
from krypton.decisions import retry
from krypton.decisions.charts import ownership
from krypton.decisions.errors import ChartNotLoaded
from krypton.decisions.trust import redact, safeyaml

BOMB = "".join(f"{k}: &{k} [" + ",".join([f"*{p}"] * 9 if p else ["lol"] * 9) + "]\n"
               for p, k in zip(["", "a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "f"],
                               strict=True))


@pytest.mark.parametrize(("text", "limits", "fragment"), [
    (BOMB, safeyaml.VALUES, "expands to more than"),
    ("[" * 100 + "]" * 100, safeyaml.VALUES, "nested deeper"),
    ("a: &a [*a]", safeyaml.VALUES, "recursive alias"),
    ("a: " + "x" * (2 << 20), safeyaml.VALUES, "over the limit"),
    ("a: [", safeyaml.VALUES, "not valid YAML (line"),
    ("- 1\n- 2\n", None, "not a YAML mapping"),
])
def test_bounded_yaml_refuses(text: str, limits: safeyaml.Limits | None, fragment: str) -> None:
    with pytest.raises(safeyaml.YamlRejected, match=fragment.replace("(", r"\(")):
        if limits is None:
            safeyaml.load_values(text, what="values")
        else:
            safeyaml.load(text, limits)


def test_bounded_yaml_keeps_ordinary_aliases() -> None:
    assert safeyaml.load_values("base: &b {x: 1}\nother: *b\n", what="v") == \
        {"base": {"x": 1}, "other": {"x": 1}}
    assert safeyaml.load_values("", what="v") == {}


def test_bomb_is_refused_quickly() -> None:
    bigger = BOMB + "g: &g [" + ",".join(["*f"] * 9) + "]\nh: [" + ",".join(["*g"] * 9) + "]\n"
    start = time.process_time()
    with pytest.raises(safeyaml.YamlRejected):
        safeyaml.load_values(bigger, what="v")
    assert time.process_time() - start < 1.0  # linear in the text, not in the expansion


@pytest.mark.parametrize(("text", "masked"), [
    ("GET / Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
    ("{'authorization': 'Basic dXNlcjpwYXNz'}", "dXNlcjpwYXNz"),
    ("key -----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY----- end", "MIIEv"),
    ("data LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t", "LS0tLS1CRUdJTiBQUklWQVRF"),
])
def test_redaction_patterns(text: str, masked: str) -> None:
    assert masked not in redact.scrub(text)
    assert redact.MASK in redact.scrub(text)


def test_registered_credentials_are_masked_everywhere() -> None:
    redact.register("s3cr3t-t0ken-value", "short", None)
    assert redact.scrub("failed with s3cr3t-t0ken-value in it") == \
        f"failed with {redact.MASK} in it"
    assert redact.scrub("short stays") == "short stays"  # too short to be registered
    event = redact.structlog_processor(None, "error", {"error": ValueError("s3cr3t-t0ken-value"),
                                                       "n": 3})
    assert event == {"error": f"{redact.MASK}", "n": 3}
    assert redact.describe(RuntimeError("x s3cr3t-t0ken-value")) == f"RuntimeError: x {redact.MASK}"


def test_ownership_conflicts() -> None:
    docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": "w.example"}}, None, "junk", {"kind": "NoMeta"}]
    refs = ownership.manifest_objects(docs)
    assert [str(r) for r in refs] == ["ConfigMap c", "CustomResourceDefinition w.example"]
    mine = {ownership.RELEASE_NAME: "r", ownership.RELEASE_NAMESPACE: "ns"}
    theirs = {ownership.RELEASE_NAME: "other", ownership.RELEASE_NAMESPACE: "o"}
    assert ownership.conflicts({refs[0]: mine, refs[1]: mine}, "r", "ns") == []
    assert ownership.conflicts({refs[0]: mine, refs[1]: theirs}, "r", "ns") == [
        "CustomResourceDefinition w.example is owned by release o/other"]
    assert ownership.conflicts({refs[0]: {}}, "r", "ns") == [
        "ConfigMap c is owned by no Helm release (not created by this release)"]
    same_name_other_ns = {ownership.RELEASE_NAME: "r", ownership.RELEASE_NAMESPACE: "x"}
    assert ownership.conflicts({refs[0]: same_name_other_ns}, "r", "ns")


@pytest.mark.parametrize(("index", "fragment"), [
    ([], "not a YAML mapping"), ({"entries": []}, "entries is not a mapping"),
    ({"entries": {"other": []}}, "is not in repository"),
    ({"entries": {"sample": {"version": 1}}}, "entries.sample is not a list"),
])
def test_malformed_index(index: object, fragment: str) -> None:
    with pytest.raises(ChartNotLoaded, match=fragment):
        index_versions(index, "sample", "http://r")


def test_index_versions_skips_junk_entries() -> None:
    assert index_versions({"entries": {"sample": [{"version": "1.0.0"}, "x", {"v": 1}]}},
                          "sample", "http://r") == ["1.0.0"]


@pytest.mark.parametrize(("text", "safe"), [
    ("sample-1.0.0", "sample-1.0.0"), ("sample-../../etc", "sample-.._.._etc"), ("..", "_"),
    ("a/b", "a_b")])
def test_safe_path_component(text: str, safe: str) -> None:
    assert _safe_component(text) == safe


def test_failing_worker_is_reported_and_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """D8 with a fake of our own ClusterWorker port: an unexpected exception is reported once
    per failure (credential-free), counted, shown as failing, and the worker runs again."""
    from krypton.adapters import metrics
    from krypton.decisions.clusters.discovery import ClusterSpec
    from krypton.decisions.clusters.kubeconfig import parse
    from krypton.decisions.settings import Settings
    from krypton.runtime import fleet as fleet_mod

    redact.register("worker-secret-token")
    runs: list[int] = []

    class FailingWorker:
        engaged = False
        last_error = ""

        def __init__(self, *_args: object) -> None:
            pass

        async def run(self) -> None:
            runs.append(1)
            if len(runs) < 3:
                raise KeyError("boom with worker-secret-token")
            await asyncio.sleep(3600)

        async def stop(self, grace: float = 0.0) -> None:
            pass

    monkeypatch.setattr(fleet_mod, "ClusterWorker", FailingWorker)
    monkeypatch.setattr(retry, "WORKER_RESTART", retry.Policy(first=0.05, cap=300.0))
    reports: list[tuple[str, str, str]] = []

    class Recorder:
        async def emit(self, _involved: object, type_: str, reason: str, message: str) -> None:
            reports.append((type_, reason, message))

    kc = "\n".join(["apiVersion: v1", "clusters: [{name: c, cluster: {server: 'https://h'}}]",
                    "users: [{name: u, user: {token: worker-secret-token}}]",
                    "contexts: [{name: x, context: {cluster: c, user: u}}]",
                    "current-context: x"])
    assert parse(kc).token == "worker-secret-token"
    fleet = fleet_mod.Fleet(Settings(), None, Recorder())  # type: ignore[arg-type]
    before = metrics.WORKER_FAILURES.labels("flaky")._value.get()
    spec = ClusterSpec("flaky", "ns", "uid", kc.encode(), None, "digest")

    async def scenario() -> dict[str, str]:
        await fleet._engage(spec)
        health_seen = {}
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(runs) == 1 and reports:
                health_seen = fleet.health()
            if len(runs) >= 3:
                break
        await fleet.shutdown(0)
        return health_seen

    seen = asyncio.run(scenario())
    assert len(runs) == 3  # failed twice, restarted twice, then kept running
    assert [r[1] for r in reports] == ["WorkerFailed", "WorkerFailed"]
    assert all(r[0] == "Warning" and "KeyError" in r[2] and "restarting in" in r[2]
               and "worker-secret-token" not in r[2] for r in reports)
    assert seen.get("flaky", "").startswith("failing: WorkerFailed: KeyError")
    assert metrics.WORKER_FAILURES.labels("flaky")._value.get() - before == 2


def test_helm_ownership_error_names_object_and_owner() -> None:
    from pyhelm3 import errors as helm_errors

    from krypton.adapters.helm import _helm_error
    from krypton.decisions.errors import OwnershipConflict

    stderr = ('Error: Unable to continue with install: CustomResourceDefinition "w.example" in '
              'namespace "" exists and cannot be imported into the current release: invalid '
              'ownership metadata; annotation validation error: key "meta.helm.sh/release-name" '
              'must equal "tenant-b-c": current value is "tenant-a-c"; annotation validation '
              'error: key "meta.helm.sh/release-namespace" must equal "b": current value is "a"')
    err = _helm_error(helm_errors.Error(1, b"", stderr.encode()))
    assert isinstance(err, OwnershipConflict)
    assert str(err).startswith("CustomResourceDefinition w.example is owned by release a/tenant-a-c")


@pytest.mark.parametrize(("stderr", "message"), [
    # helm 4.2.4, --wait on a Deployment whose pods cannot be scheduled (seen on the test bed)
    ("Error: INSTALLATION FAILED: resource Deployment/default/x not ready. status: InProgress, "
     "message: Available: 0/2\ncontext deadline exceeded\n",
     "INSTALLATION FAILED: resource Deployment/default/x not ready. status: InProgress, "
     "message: Available: 0/2; context deadline exceeded"),
    # helm 3.19.5, the same case: it says no more than this
    ("Error: INSTALLATION FAILED: context deadline exceeded\n",
     "INSTALLATION FAILED: context deadline exceeded"),
    # warnings and client-go log lines are not the error
    ("WARNING: Kubernetes configuration file is group-readable.\n"
     "W1123 06:00:00.000000   1 warnings.go:70] v1 Endpoints is deprecated\n"
     "Error: UPGRADE FAILED: failed post-upgrade: 1 error occurred:\n\t* job x-smoke failed: "
     "BackoffLimitExceeded\n",
     "UPGRADE FAILED: failed post-upgrade: 1 error occurred:; * job x-smoke failed: "
     "BackoffLimitExceeded"),
    ("", "helm exited with 1"),
])
def test_helm_errors_keep_every_line_that_says_what_failed(stderr: str, message: str) -> None:
    from pyhelm3 import errors as helm_errors

    from krypton.adapters.helm import _helm_error

    assert str(_helm_error(helm_errors.Error(1, b"", stderr.encode()))) == message


def test_helm_errors_are_bounded() -> None:
    from pyhelm3 import errors as helm_errors

    from krypton.adapters.helm import MESSAGE_LIMIT, _helm_error

    long = "\n".join(f"resource ConfigMap/ns/c{i} not ready" for i in range(200))
    text = str(_helm_error(helm_errors.Error(1, b"", long.encode())))
    assert len(text) == MESSAGE_LIMIT and text.endswith("…")
    assert text.startswith("resource ConfigMap/ns/c0 not ready; resource ConfigMap/ns/c1")


def test_drop_cluster_drops_every_series_of_that_cluster_only() -> None:
    from prometheus_client import generate_latest

    from krypton.adapters import metrics

    for cluster in ("gone-x", "kept-x"):
        metrics.RECONCILES.labels(cluster).inc()
        metrics.RECONCILE_SECONDS.labels(cluster).observe(0.3)
        metrics.TENANT_RELEASE.labels(cluster, "ns", "t", "r", "1.0.0", "f" * 8, "").set(1)
        metrics.WINDOW_OPEN.labels(cluster).set(1)
    metrics.drop_cluster("gone-x")
    text = generate_latest().decode()
    assert 'cluster="gone-x"' not in text
    assert text.count('cluster="kept-x"') >= 4


def test_every_series_labelled_by_cluster_goes_with_its_cluster() -> None:
    """A metric whose first label is the cluster is one drop_cluster drops: what the
    operator keeps per cluster returns to baseline when the cluster goes. Read from the
    source: each metric made with a label list that starts with "cluster"."""
    import ast
    import inspect

    from krypton.adapters import metrics

    labelled = set()
    for node in ast.walk(ast.parse(inspect.getsource(metrics))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and any(
                isinstance(arg, ast.List) and arg.elts and
                isinstance(arg.elts[0], ast.Constant) and arg.elts[0].value == "cluster"
                for arg in node.value.args):
            labelled |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    dropped = {name for name, metric in vars(metrics).items()
               if any(metric is m for m in metrics._PER_CLUSTER)}  # noqa: SLF001
    assert len(labelled) > 20 and labelled == dropped, labelled ^ dropped


def test_cached_objects_keep_only_what_krypton_reads() -> None:
    """Every engaged cluster's watch caches live in memory: managedFields are dropped from
    every object, and a Helm release record keeps its name, namespace, version, labels and
    creation time only (1000 clusters)."""
    from krypton.adapters.informer import release_record_metadata
    from krypton.adapters.kube import without_managed_fields

    managed = [{"manager": "helm", "operation": "Update", "fieldsV1": {"f:data": {}}}]
    record = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
              "metadata": {"name": "sh.helm.release.v1.r.v1", "namespace": "acme",
                           "uid": "u", "resourceVersion": "7", "managedFields": managed,
                           "creationTimestamp": "2026-11-23T00:00:00Z",
                           "labels": {"owner": "helm", "name": "r", "status": "deployed",
                                      "version": "1"}}}
    assert release_record_metadata(record) == {"metadata": {
        "name": "sh.helm.release.v1.r.v1", "namespace": "acme", "resourceVersion": "7",
        "creationTimestamp": "2026-11-23T00:00:00Z",
        "labels": {"owner": "helm", "name": "r", "status": "deployed", "version": "1"}}}
    tenant = {"metadata": {"name": "t", "managedFields": managed}, "spec": {}, "status": {}}
    slim = without_managed_fields(tenant)
    assert slim == {"metadata": {"name": "t"}, "spec": {}, "status": {}}
    assert tenant["metadata"]["managedFields"] == managed  # the original is not changed


def test_cached_tenants_share_their_keys_and_short_strings() -> None:
    """Two Tenants decoded apart keep one copy of each key and short string they have in
    common (a fleet's Tenants repeat their condition types, reasons and versions); what
    they hold is unchanged, managedFields are dropped, and a nesting deeper than the walk
    goes is kept as it is, without deeper recursion."""
    import json

    from krypton.adapters.informer import SHARED_DEPTH, SHARED_STRING_LENGTH, shared_strings

    def tenant(name: str) -> str:
        # built from parts, so that no two equal strings are one object before decoding
        return json.dumps({
            "metadata": {"name": name, "managedFields": [{"manager": "krypton"}],
                         "annotations": {"mesh.openkcm.io/fingerprint-home": "ab" * 32}},
            "spec": {"values": {"long": "x" * (SHARED_STRING_LENGTH + 1)}},
            "status": {"phase": "Re" + "ady", "conditions": [
                {"type": "ClusterReady/" + "home", "status": "Tr" + "ue",
                 "reason": "Install" + "ed", "message": "chart sample 0.2.0 installed"}]}})

    raw_a, raw_b = json.loads(tenant("a")), json.loads(tenant("b"))
    a, b = shared_strings(raw_a), shared_strings(raw_b)
    expected = json.loads(tenant("a"))
    del expected["metadata"]["managedFields"]
    assert a == expected
    assert "managedFields" in raw_a["metadata"]  # the decoded original is not changed
    # the same objects, not equal copies
    cond_a, cond_b = a["status"]["conditions"][0], b["status"]["conditions"][0]
    assert [k for k in cond_a] == [k for k in cond_b]
    assert all(x is y for x, y in zip(cond_a, cond_b, strict=True))
    assert all(cond_a[k] is cond_b[k] for k in cond_a)
    assert a["status"]["phase"] is b["status"]["phase"]
    fingerprint = "mesh.openkcm.io/fingerprint-home"
    assert a["metadata"]["annotations"][fingerprint] is b["metadata"]["annotations"][fingerprint]
    # a string longer than the limit is left alone: equal, two objects
    assert a["spec"]["values"]["long"] == b["spec"]["values"]["long"]
    assert a["spec"]["values"]["long"] is not b["spec"]["values"]["long"]

    # far deeper than the walk (and than the recursion limit): the nesting is kept as is
    deep: dict[str, object] = {"leaf": "v"}
    for _ in range(5000):
        deep = {"d": deep}
    slim = shared_strings({"metadata": {"name": "n"}, "spec": deep})
    inner = slim["spec"]
    for _ in range(SHARED_DEPTH - 1):
        inner = inner["d"]
    assert slim["spec"] is not deep  # copied where the walk went
    below = deep
    for _ in range(SHARED_DEPTH - 1):
        below = below["d"]  # type: ignore[assignment]
    assert inner is below  # the walk stopped here and kept the rest as it was


def test_a_failed_chart_load_is_answered_from_the_cache_with_growing_backoff(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A chart that cannot be loaded is not fetched again on every pass: the failure is the
    answer for failure_ttl (10 s here), then 20 s, 40 s, ... after each further failure."""
    from krypton.adapters import charts
    from krypton.decisions.errors import ChartNotLoaded

    clock = [100.0]
    monkeypatch.setattr(charts.time, "monotonic", lambda: clock[0])
    source = charts.ChartSource("https://r", "c", "1.0.0", helm=None,  # type: ignore[arg-type]
                                cache_dir=tmp_path, failure_ttl=10.0)
    loads = 0

    async def load() -> charts.ResolvedChart:
        nonlocal loads
        loads += 1
        raise ChartNotLoaded("repository down")

    monkeypatch.setattr(source, "_load", load)
    seen = []
    for now in (100.0, 109.0, 110.5, 130.0, 130.5, 170.0, 170.6):
        clock[0] = now
        with pytest.raises(ChartNotLoaded):
            asyncio.run(source.get())
        seen.append(loads)
    assert seen == [1, 1, 2, 2, 3, 3, 4]


def test_a_credential_registered_later_is_masked_in_a_text_scrubbed_before() -> None:
    """scrub remembers its answers for short texts: registering a credential
    must forget them, or a text scrubbed once before would keep the credential in clear."""
    from krypton.decisions.trust import redact

    secret = "s3cr3t-" + "x" * 20
    text = f"cluster c1 uses {secret}"
    assert redact.scrub(text) == text  # not known yet: nothing to mask
    redact.register(secret)
    assert secret not in redact.scrub(text) and redact.MASK in redact.scrub(text)


def test_a_task_groups_failure_is_described_by_its_cause() -> None:
    """A worker failing inside its task group says what failed, not "unhandled errors in a
    TaskGroup"."""
    group = ExceptionGroup("unhandled errors in a TaskGroup (1 sub-exception)", [
        ExceptionGroup("nested", [KeyError("status"), ValueError("b")])])
    assert redact.describe(group) == "KeyError: 'status' (and 1 more)"
