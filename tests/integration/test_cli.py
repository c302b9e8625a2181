"""O7: krypton plan, status, register-cluster and crds against the real test bed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from krypton.testing.operator import wait_for
from krypton.testing.watching import Watching, row

from .conftest import Fleet, unique

ROOT = Path(__file__).resolve().parents[2]


def cli_env(fleet: Fleet, env: dict[str, str] | None = None) -> dict[str, str]:
    """The CLI's environment: the test bed's tools first; settings only from the flags
    given (no operator Deployment of another test), unless `env` says otherwise."""
    return {**os.environ, "PATH": f"{fleet.testbin}:{os.environ['PATH']}",
            "KRYPTON_FROM_DEPLOYMENT": "none", **(env or {})}


def krypton(fleet: Fleet, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "krypton", *args], capture_output=True,
                          text=True, timeout=120, env=cli_env(fleet, env))


def run_flags(fleet: Fleet, version: str = "0.2.0") -> list[str]:
    flags = fleet.args(version=version)
    return [f for f in flags if f not in ("--resync-period", "600s", "--helm-timeout", "60s")]


def test_plan_shows_install_skip_upgrade_then_nothing(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    same = fleet.tenant(fleet.remote, unique("same"))
    drift = fleet.tenant(fleet.remote, unique("drift"))
    for name in (same, drift):
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    op.stop()
    new = fleet.tenant(fleet.remote, unique("new"))
    fleet.remote.patch_tenant(fleet.tenant_ns, drift, {"metadata": {"annotations": {
        "mesh.openkcm.io/fingerprint-remote": None}}})

    result = krypton(fleet, "plan", *run_flags(fleet))
    assert result.returncode == 2, result.stdout + result.stderr
    rows = {line.split()[2]: line for line in result.stdout.splitlines()[1:]}
    assert " install " in rows[new] and "- -> 0.2.0" in rows[new]
    assert " skip " in rows[same] and "NoChange" in rows[same]
    assert " annotate " in rows[drift] and "annotation missing" in rows[drift]
    as_json = json.loads(krypton(fleet, "plan", *run_flags(fleet), "-o", "json").stdout)
    assert {r["tenant"]: r["action"] for r in as_json} == {new: "install", same: "skip",
                                                           drift: "annotate"}
    bump = krypton(fleet, "plan", *run_flags(fleet, version="0.3.0"), "-o", "json")
    assert bump.returncode == 2
    assert sorted(r["action"] for r in json.loads(bump.stdout)) == ["install", "upgrade", "upgrade"]

    fleet.start()
    fleet.remote.wait_phase(fleet.tenant_ns, new, "Ready")
    wait_for(lambda: krypton(fleet, "plan", *run_flags(fleet)).returncode == 0, 60,
             what="plan exit 0 after convergence")
    # a chart version the repository lacks changes nothing, and blocks every row: not 0
    missing = krypton(fleet, "plan", *run_flags(fleet, version="9.9.9"), "-o", "json")
    assert {r["action"] for r in json.loads(missing.stdout)} == {"blocked"}
    assert missing.returncode == 2

    status = krypton(fleet, "status", *run_flags(fleet))
    assert status.returncode == 0
    lines = status.stdout.splitlines()
    assert lines[0].split()[:7] == ["CLUSTER", "NAMESPACE", "TENANT", "PHASE", "RELEASE", "CHART",
                                    "FINGERPRINT"]
    assert any(new in line and "Ready" in line and "0.2.0" in line for line in lines)
    as_yaml = yaml.safe_load(krypton(fleet, "status", *run_flags(fleet), "-o", "yaml").stdout)
    # the Tenants' rows (a cluster's own rows, such as releases an earlier test left under a
    # cluster name no longer discovered, have no Tenant)
    assert {r["tenant"] for r in as_yaml if r["tenant"]} == {new, same, drift}


def test_register_cluster_good_and_refused(fleet: Fleet, tmp_path: Path) -> None:
    common = ["--watch-kubeconfig", str(fleet.home.cp.kubeconfig), "--namespace",
              fleet.discovery_ns]
    ok = krypton(fleet, "register-cluster", "remote", "--kubeconfig",
                 str(fleet.remote.cp.kubeconfig), *common)
    assert ok.returncode == 0, ok.stderr
    assert "registered" in ok.stdout and "v1.34.4" in ok.stdout
    secret = fleet.home.core.read_namespaced_secret("remote", fleet.discovery_ns)
    assert secret.metadata.labels["sigs.k8s.io/multicluster-runtime-kubeconfig"] == "true"
    op = fleet.start()
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 30,
             what="registered cluster engaged")

    doc = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                        "command": "/bin/true"}}
    evil = tmp_path / "evil"
    evil.write_text(yaml.safe_dump(doc))
    refused = krypton(fleet, "register-cluster", "evil", "--kubeconfig", str(evil), *common)
    assert refused.returncode == 2
    assert "refused" in refused.stderr and "user.exec" in refused.stderr
    assert fleet.home.core.list_namespaced_secret(
        fleet.discovery_ns, field_selector="metadata.name=evil").items == []


def test_crds_prints_the_canonical_crd(fleet: Fleet) -> None:
    out = krypton(fleet, "crds")
    assert out.returncode == 0
    assert out.stdout == (ROOT / "crds" / "mesh.openkcm.io_tenants.yaml").read_text()


def test_plan_and_diff_say_what_a_change_would_change(fleet: Fleet, tmp_path: Path) -> None:
    """Plan names what differs from what a release was made with (the repository
    URL as typed, which values keys), and diff shows the manifest change per Tenant x cluster:
    nothing for a new spelling of the same repository, the changed ConfigMap for a value."""
    fleet.register("remote", fleet.remote)
    fleet.start()
    name = fleet.tenant(fleet.remote, unique("diff"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"

    unchanged = krypton(fleet, "diff", *run_flags(fleet))
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert f"=== remote/{fleet.tenant_ns}/{name} ({release}): no change" in unchanged.stdout

    values = tmp_path / "values.yaml"
    values.write_text("data:\n  colour: blue\n")
    flags = [*run_flags(fleet), "--chart-values-file", str(values)]
    planned = json.loads(krypton(fleet, "plan", *flags, "-o", "json").stdout)
    assert [(r["tenant"], r["action"], r["change"]) for r in planned] == \
        [(name, "upgrade", "values: data.colour")]
    diff = krypton(fleet, "diff", *flags)
    assert diff.returncode == 2, diff.stdout + diff.stderr
    assert f"--- remote/{name} deployed (revision 1) ConfigMap {release}" in diff.stdout
    assert f"+++ remote/{name} next (chart 0.2.0) ConfigMap {release}" in diff.stdout
    assert "+  colour: blue" in diff.stdout

    url = fleet.chart_repo.url
    moved = url.replace("127.0.0.1", "localhost")
    assert moved != url
    respelt = [moved if f == url else f for f in run_flags(fleet)]
    planned = json.loads(krypton(fleet, "plan", *respelt, "-o", "json").stdout)
    assert [(r["action"], r["change"]) for r in planned] == [("upgrade", f"repo {url} -> {moved}")]
    same = krypton(fleet, "diff", *respelt)
    assert same.returncode == 0, same.stdout + same.stderr  # the same chart, the same manifest


def test_diff_renders_only_what_would_run_and_says_why_not(fleet: Fleet,
                                                           tmp_path: Path) -> None:
    """Diff decides as the operator does (the same ``decide()``). With a values
    change, the Tenant that would be upgraded shows its manifest change; one the operator
    refuses (a reserved namespace) and one it would not run helm for (Stalled: its retries
    exhausted on this very target) show none, and say why."""
    from krypton.decisions.charts.fingerprint import fingerprint

    fleet.register("remote", fleet.remote)
    op = fleet.start()
    ok = fleet.tenant(fleet.remote, unique("ok"))
    fleet.remote.wait_phase(fleet.tenant_ns, ok, "Ready")
    op.stop()
    values = tmp_path / "values.yaml"
    values.write_text("data:\n  colour: blue\n")
    target = fingerprint(fleet.chart_repo.url, "sample", "0.2.0", {"data": {"colour": "blue"}})
    reserved = fleet.tenant(fleet.remote, "default")
    stalled = fleet.tenant(fleet.remote, unique("stalled"))
    fleet.remote.custom.patch_namespaced_custom_object_status(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", stalled,
        {"status": {"clusters": {"remote": {"failures": 99, "failedTarget": f"{target}/1/"}}}})

    diff = krypton(fleet, "diff", *run_flags(fleet), "--chart-values-file", str(values))
    assert diff.returncode == 2, diff.stdout + diff.stderr
    assert f"+++ remote/{ok} next (chart 0.2.0) ConfigMap tenant-{ok}-remote" in diff.stdout
    for name, why in ((reserved, "ReservedNamespace (namespace 'default' is reserved"),
                      (stalled, "RetriesExhausted (99 attempts of chart 0.2.0 failed")):
        heading = f"=== remote/{fleet.tenant_ns}/{name} (tenant-{name}-remote) not changed: {why}"
        assert heading in diff.stdout, diff.stdout
        assert diff.stdout.split(heading, 1)[1].split("\n", 1)[0].endswith("): no change")
        assert f"remote/{name} next" not in diff.stdout


def test_status_watch_follows_the_fleet_live(fleet: Fleet) -> None:
    """A live table and progress bar, redrawn from watches: a new Tenant, its
    install and a pause show up without the command being run again."""
    fleet.register("remote", fleet.remote)
    fleet.start()
    first = fleet.tenant(fleet.remote, unique("first"))
    fleet.remote.wait_phase(fleet.tenant_ns, first, "Ready")
    # started as some CI runners start the suite, with SIGINT ignored (children inherit
    # that): Ctrl-C at the end must still stop it
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        watching = Watching("--wide", *run_flags(fleet), env=cli_env(fleet))
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        # each wait is shorter than the 30 s refresh of --watch: a frame in time was caused
        # by a watch event
        watching.wait_frame(lambda f: row(f, first)[3:4] == ["Ready"]
                            and "releases ready  [####################] 1/1" in f,
                            "a frame with the first Tenant Ready")
        second = fleet.tenant(fleet.remote, unique("second"))
        watching.wait_frame(lambda f: bool(row(f, second)), "a frame with the new Tenant")
        done = watching.wait_frame(
            lambda f: "releases ready  [####################] 2/2" in f,
            "a frame with both releases ready")
        assert row(done, second)[3:6] == ["Ready", f"tenant-{second}-remote", "0.2.0"]
        assert row(done, second)[-1] == "ready on remote"  # --wide: the Ready message
        fleet.remote.patch_tenant(fleet.tenant_ns, first, {"metadata": {"annotations": {
            "mesh.openkcm.io/paused": "true"}}})
        paused = watching.wait_frame(lambda f: row(f, first)[3:4] == ["Suspended"],
                                     "a frame with the first Tenant Suspended")
        # DETAIL says why first (the update notice of the repository's 0.3.0 follows it)
        assert any(cell.startswith("Suspended: reconciliation paused by annotation")
                   for cell in row(paused, first)), row(paused, first)
        assert "releases ready  [####################] 2/2" in paused  # still installed
        # a new cluster Secret reopens the fleet; the operator's Warning on it (the same API
        # server as remote) marks it Failing
        fleet.register("extra", fleet.remote)
        watching.wait_frame(lambda f: bool(row(f, first, "extra")),
                            "a frame with the Tenants of the new cluster")
        failing = watching.wait_frame(
            lambda f: any(line.startswith("extra ") and " Failing " in line
                          and "DuplicateCluster" in line for line in f.splitlines()),
            "a frame with the new cluster Failing")
        assert row(failing, first, "remote")[3] == "Suspended"
        frames = watching.frames()
        assert len(frames) == len(set(f.split("\n", 1)[1] for f in frames))  # only changes
    finally:
        code = watching.stop()
    assert code == 0, watching.stderr()


def test_the_cli_takes_the_operators_settings_from_its_deployment(fleet: Fleet,
                                                                  tmp_path: Path) -> None:
    """With the operator installed by its chart, `krypton status` and `plan` need
    no flag but the cluster: chart, values (from the chart's ConfigMap), discovery
    namespace, watch namespace and driver come from the Deployment; what is typed wins."""
    from krypton.testing.pod import render_chart

    fleet.register("remote", fleet.remote)
    values = {"data": {"colour": "blue"}}
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    fleet.start("--chart-values-file", str(values_file))
    name = fleet.tenant(fleet.remote, unique("dep"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")

    objects = render_chart(fleet.testbin / "helm", ROOT / "chart", release="krypton",
                           namespace=fleet.discovery_ns, include_crds=False, values={
                               "chart": {"repo": fleet.chart_repo.url, "name": "sample",
                                         "version": "0.2.0", "values": values},
                               "discovery": {"namespace": fleet.discovery_ns},
                               "selfCluster": {"enabled": False},
                               "helm": {"driver": "secret"},
                               "extraEnv": [{"name": "WATCH_NAMESPACE",
                                             "value": fleet.tenant_ns}]})
    applied = [o for o in objects if o["kind"] in ("Deployment", "ConfigMap")]
    kubectl = [str(fleet.testbin / "kubectl"), "--kubeconfig", str(fleet.home.cp.kubeconfig)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(applied),
                   check=True, capture_output=True, text=True)
    home = ["--watch-kubeconfig", str(fleet.home.cp.kubeconfig)]
    # the Deployment is looked for where the user points: their --namespace
    auto = {"KRYPTON_FROM_DEPLOYMENT": "", "KRYPTON_NAMESPACE": fleet.discovery_ns}
    try:
        status = krypton(fleet, "status", *home, env=auto)
        assert status.returncode == 0, status.stderr
        assert f"settings of the operator Deployment {fleet.discovery_ns}/krypton: took " \
            "--chart-repo, --chart-name, --chart-version, --chart-values-file" in status.stderr
        assert row(status.stdout, name)[:4] == ["remote", fleet.tenant_ns, name, "Ready"]
        plan = krypton(fleet, "plan", *home, env=auto)
        assert plan.returncode == 0, plan.stdout + plan.stderr  # the same values: nothing
        # the central values change in the chart's ConfigMap: plan says so
        subprocess.run([*kubectl, "-n", fleet.discovery_ns, "patch", "configmap",
                        "krypton-values", "--type", "merge", "-p", json.dumps(
                            {"data": {"values.yaml": "data:\n  colour: red\n"}})],
                       check=True, capture_output=True)
        plan = krypton(fleet, "plan", *home, "-o", "json", env=auto)
        assert plan.returncode == 2, plan.stdout + plan.stderr
        assert [(r["tenant"], r["action"], r["change"]) for r in json.loads(plan.stdout)] == \
            [(name, "upgrade", "values: data.colour")]
        # what the user types wins: another version
        bump = krypton(fleet, "plan", *home, "--chart-version", "0.3.0", "-o", "json", env=auto)
        assert [r["chart_version"] for r in json.loads(bump.stdout)] == ["0.2.0 -> 0.3.0"]
        # without the Deployment: the defaults, and a hint that they found nothing
        alone = krypton(fleet, "status", *home, "--from-deployment", "none")
        assert alone.returncode == 0
        assert "no cluster Secrets labelled sigs.k8s.io/multicluster-runtime-kubeconfig=true " \
            "in namespace 'default'" in alone.stderr
        # register-cluster writes into the operator's discovery namespace
        extra = tmp_path / "extra.kubeconfig"
        extra.write_text(fleet.remote.cp.kubeconfig.read_text())
        done = krypton(fleet, "register-cluster", "extra", "--kubeconfig", str(extra), *home,
                       env=auto)
        assert done.returncode == 0, done.stderr
        secret = fleet.home.core.read_namespaced_secret("extra", fleet.discovery_ns)
        assert secret.metadata.labels["sigs.k8s.io/multicluster-runtime-kubeconfig"] == "true"
        fleet.unregister("extra")
        # two operators where the user points: the CLI does not guess
        second = [dict(o, metadata=dict(o["metadata"], name=f"{o['metadata']['name']}-2"))
                  for o in applied if o["kind"] == "Deployment"]
        subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(second),
                       check=True, capture_output=True, text=True)
        two = krypton(fleet, "status", *home, env=auto)
        assert two.returncode == 2
        assert "several krypton operators found" in two.stderr
        picked = krypton(fleet, "status", *home, "--from-deployment",
                         f"{fleet.discovery_ns}/krypton", env=auto)
        assert picked.returncode == 0 and row(picked.stdout, name), picked.stderr
    finally:
        for name in ("krypton", "krypton-2"):
            subprocess.run([*kubectl, "-n", fleet.discovery_ns, "delete", "deployment", name,
                            "--ignore-not-found"], check=True, capture_output=True)


def test_diff_and_plan_name_the_cluster_scoped_objects_an_upgrade_deletes(fleet: Fleet,
                                                                  tmp_path: Path) -> None:
    """Values that stop rendering a fixed-name cluster-scoped object (the
    sample chart's shared CRD) delete it on upgrade; diff says so before it happens."""
    with_crd = tmp_path / "with.yaml"
    with_crd.write_text("sharedCRD: true\n")
    fleet.register("remote", fleet.remote)
    op = fleet.start("--chart-values-file", str(with_crd))
    name = fleet.tenant(fleet.remote, unique("crd"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    op.stop()
    same = krypton(fleet, "diff", *fleet.args("--chart-values-file", str(with_crd)))
    assert "cluster-scoped objects this upgrade deletes" not in same.stdout
    dropped = krypton(fleet, "diff", *fleet.args())  # the central values without it
    assert dropped.returncode == 2, dropped.stderr
    assert "# cluster-scoped objects this upgrade deletes (whoever else uses them loses " \
           "them too):\n#   CustomResourceDefinition widgets.shared.krypton.test" in dropped.stdout
    planned = krypton(fleet, "plan", *fleet.args(), "-o", "json")
    [row] = [r for r in json.loads(planned.stdout) if r["tenant"] == name]
    assert row["action"] == "upgrade"
    assert row["change"].endswith("deletes CustomResourceDefinition widgets.shared.krypton.test")
