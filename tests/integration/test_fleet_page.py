"""The fleet page (SPEC O16) of a running operator on the bed's real control planes: the
matrix as the API servers hold the Tenants, a helm error carrying markup shown as text, the
filters and downloads of a view, and a Tenant's change reaching an open event stream."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

from kubernetes import client

from krypton.decisions.model import release_name
from krypton.testing.operator import OperatorProcess, wait_for

from .conftest import Cluster, Fleet, unique

HOSTILE = "<img src=x onerror=alert(1)></script>"


def get(op: OperatorProcess, path: str,
        bearer: str | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", op.web_port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def rows(op: OperatorProcess, query: str = "") -> list[dict[str, Any]]:
    status, _, body = get(op, f"/rows.json?{query}")
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def calm_and_evil(fleet: Fleet) -> tuple[OperatorProcess, str, str]:
    """An operator on two clusters: a Tenant Ready on remote (calm), and one on home (evil)
    whose install failed with a helm error carrying markup (home's values make the chart's
    render fail with HOSTILE)."""
    fleet.register("remote", fleet.remote)
    fleet.register("home", fleet.home, values=f"failRender: {json.dumps(HOSTILE)}\n")
    op = fleet.start()
    calm = fleet.tenant(fleet.remote, unique("calm"))
    evil = fleet.tenant(fleet.home, unique("evil"))
    fleet.remote.wait_phase(fleet.tenant_ns, calm, "Ready")
    failed = fleet.home.wait_condition(fleet.tenant_ns, evil, "ClusterError/home", "True")
    assert HOSTILE in failed["message"], failed  # the helm error carries the markup
    return op, calm, evil


def test_the_page_shows_the_fleet_as_the_clusters_hold_it_and_follows_its_changes(
        fleet: Fleet) -> None:
    op, calm, evil = calm_and_evil(fleet)

    cells = {(r["cluster"], r["tenant"]): r["state"] for r in rows(op)}
    assert cells[("remote", calm)] == "Ready" and cells[("home", evil)] == "Failed", cells
    status, headers, page = get(op, "/")
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
    assert f'data-cell="remote|{fleet.tenant_ns}/{calm}"' in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    _, _, tenant_page = get(op, f"/tenants/{fleet.tenant_ns}/{evil}")
    assert "<img src=x" not in tenant_page and "&lt;/script&gt;" in tenant_page
    assert "<td>Warning</td><td>HelmInstallFailed</td><td>" in tenant_page  # Events kept
    _, _, planned = get(op, f"/tenants/{fleet.tenant_ns}/{calm}/plan")
    assert "The next pass would: <strong>skip</strong> (NoChange)" in planned  # as plan says
    _, _, diffed = get(op, f"/tenants/{fleet.tenant_ns}/{calm}/diff")
    assert f"({release_name(calm, 'remote')}): no change in the manifest" in diffed
    assert [r["tenant"] for r in rows(op, f"tenant={calm}")] == [calm]
    _, _, table = get(op, f"/rows.csv?cluster=remote&tenant={calm}")
    assert table.splitlines()[1].startswith(f"remote,{fleet.tenant_ns},{calm},Ready,")

    # a change reaches an open stream (of this view: the new Tenant only)
    later = unique("later")
    seen: list[dict[str, Any]] = []
    conn = http.client.HTTPConnection("127.0.0.1", op.web_port, timeout=60)
    conn.request("GET", f"/events?tenant={later}")
    stream = conn.getresponse()

    def listen() -> None:
        for line in stream:
            if line.startswith(b"data: "):
                seen.append(json.loads(line[6:]))
                if seen[-1]["state"] == "Ready":
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        fleet.tenant(fleet.remote, later)
        wait_for(lambda: seen and seen[-1]["state"] == "Ready", 60,
                 what="the new Tenant's Ready row on the open stream")
    finally:
        conn.close()
    assert {(r["cluster"], r["tenant"]) for r in seen} == {("remote", later)}


def token(cluster: Cluster, namespace: str, name: str, may_read: str | None,
          may: tuple[str, str, list[str]] | None = None) -> str:
    """A ServiceAccount's token on `cluster`, the account allowed to get Tenants in
    `may_read` (None: nowhere), and with `may` (namespace, resource, verbs) more."""
    cluster.ensure_namespace(namespace)
    cluster.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    grants = [(ns, resource, verbs) for ns, resource, verbs in (
        (may_read, "tenants", ["get"]), may or (None, "", [])) if ns is not None]
    for ns, resource, verbs in grants:
        rbac.create_namespaced_role(ns, {"metadata": {"name": f"{name}-{resource}"}, "rules": [
            {"apiGroups": ["mesh.openkcm.io"], "resources": [resource], "verbs": verbs}]})
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": f"{name}-{resource}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": f"{name}-{resource}"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    answer = cluster.core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 600}})
    return str(answer.status.token)


def test_with_kubernetes_auth_a_token_sees_the_tenants_its_identity_may_get(
        fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start("--web-auth", "kubernetes")
    calm = fleet.tenant(fleet.remote, unique("calm"))
    fleet.remote.wait_phase(fleet.tenant_ns, calm, "Ready")
    reader = token(fleet.home, fleet.tenant_ns, unique("reader"), fleet.tenant_ns)
    elsewhere = unique("elsewhere")
    other = token(fleet.home, elsewhere, "reader", elsewhere)  # may read its own namespace
    foreign = token(fleet.remote, fleet.tenant_ns, unique("reader"), fleet.tenant_ns)

    def seen(bearer: str | None, path: str = "/rows.json") -> tuple[int, str]:
        status, _, body = get(op, path, bearer)
        return status, body

    assert seen(None)[0] == 401
    assert seen(foreign)[0] == 401  # the remote cluster's token means nothing on home
    status, body = seen(reader)
    assert status == 200 and [r["tenant"] for r in json.loads(body)] == [calm]
    assert seen(other) == (200, "[]")
    assert seen(other, f"/tenants/{fleet.tenant_ns}/{calm}")[0] == 404
    status, page = seen(reader, f"/tenants/{fleet.tenant_ns}/{calm}")
    assert status == 200 and f"system:serviceaccount:{fleet.tenant_ns}:" in page


def post(op: OperatorProcess, path: str, bearer: str, form: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", op.web_port, timeout=10)
    try:
        conn.request("POST", path, body=form, headers={
            "Authorization": f"Bearer {bearer}", "Origin": f"http://127.0.0.1:{op.web_port}",
            "Content-Type": "application/x-www-form-urlencoded"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def awaiting_approval(fleet: Fleet, *extra: str) -> tuple[OperatorProcess, str]:
    """A rollout from 0.2.0 to 0.3.0 over home (the canary) and remote, whose second wave
    waits for a person's approval: the operator (with `extra` flags) and remote's Tenant."""
    from .test_progressive_rollout import APPROVAL, ROLLOUT
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    first = fleet.start(*ROLLOUT)
    h, r = fleet.tenant(fleet.home, unique("h")), fleet.tenant(fleet.remote, unique("r"))
    fleet.home.wait_phase(fleet.tenant_ns, h, "Ready")
    fleet.remote.wait_phase(fleet.tenant_ns, r, "Ready")
    first.stop()
    op = fleet.start(*ROLLOUT, *APPROVAL, *extra, version="0.3.0")  # the canary moves
    fleet.remote.wait_condition(fleet.tenant_ns, r, "ClusterProgress/remote", "False",
                                "RolloutAwaitingApproval")
    return op, r


def test_a_person_allowed_to_approve_approves_on_the_page_and_is_named(fleet: Fleet) -> None:
    from .test_progressive_rollout import rollout_state
    op, _ = awaiting_approval(fleet, "--web-auth", "kubernetes")
    waiting = wait_for(lambda: (s := rollout_state(fleet)) and s["awaiting"] and s, 90,
                       what="wave 2 awaiting approval")
    approver = unique("approver")
    allowed = token(fleet.home, fleet.tenant_ns, approver, fleet.tenant_ns,
                    (fleet.discovery_ns, "rollouts", ["approve"]))
    reader = token(fleet.home, fleet.tenant_ns, unique("reader"), fleet.tenant_ns)
    form = f"target={waiting['target']}"

    status, body = post(op, "/rollout/approve", reader, form)
    assert status == 403 and "may not approve" in body, body
    _, _, page = get(op, "/", reader)
    assert 'data-action="approve"' not in page
    _, _, page = get(op, "/", allowed)
    assert 'data-action="approve"' in page and 'data-action="pause"' not in page
    assert (rollout_state(fleet) or {}).get("awaiting")  # nothing moved yet

    status, body = post(op, "/rollout/approve", allowed, form)
    assert status == 303, body
    wait_for(lambda: (rollout_state(fleet) or {}).get("phase") == "Complete", 90,
             what="rollout complete after the page's approval")
    who = f"system:serviceaccount:{fleet.tenant_ns}:{approver}"
    asked = fleet.home.wait_event(fleet.discovery_ns, "krypton-rollout", "RolloutControlAsked")
    assert who in asked.message, asked.message
    assert any(who in a.get("by", "") for a in (rollout_state(fleet) or {}).get("approvals", []))
