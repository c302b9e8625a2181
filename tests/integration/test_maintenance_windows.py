"""F8 maintenance windows on the real test bed: a cluster whose window is closed keeps its
release until the window opens (a window that opens during the test), while a new Tenant's
first install goes ahead."""

from __future__ import annotations

import datetime as dt

from krypton.testing.operator import kubeconfig_secret, wait_for

from .conftest import Fleet, unique

YEARLY = "0 0 1 1 * 1m"  # the default here: closed for the whole test


def test_a_cluster_is_upgraded_only_once_its_window_opens(fleet: Fleet) -> None:
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    opens = now + dt.timedelta(minutes=3 if dt.datetime.now(dt.UTC).second > 30 else 2)
    window = f"{opens.minute} {opens.hour} * * * 2m"  # UTC
    body = kubeconfig_secret("remote", fleet.remote.cp.kubeconfig.read_text(),
                             namespace=fleet.discovery_ns)
    body["metadata"]["annotations"] = {"mesh.openkcm.io/maintenance-window": window}
    fleet.home.core.create_namespaced_secret(fleet.discovery_ns, body)
    op = fleet.start("--maintenance-window", YEARLY)
    ns, name = fleet.tenant_ns, fleet.tenant(fleet.remote, unique("win"))
    # the window is closed, and a new Tenant's first install goes ahead
    fleet.remote.wait_phase(ns, name, "Ready")
    op.stop()

    op = fleet.start("--maintenance-window", YEARLY, version="0.3.0")
    held = fleet.remote.wait_condition(ns, name, "ClusterProgress/remote", "False",
                                       "OutsideMaintenanceWindow")
    assert held["message"] == (
        f"the change waits for the maintenance window of cluster remote ({window}); the next "
        f"one opens at {opens.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    assert dt.datetime.now(dt.UTC) < opens
    wait_for(lambda: op.metric("krypton_cluster_maintenance_window_open",
                               cluster="remote") == 0 < opens.timestamp() - dt.datetime.now(
                                   dt.UTC).timestamp(), 15, what="the window gauge closed")
    fleet.remote.wait_event(ns, name, "OutsideMaintenanceWindow")
    writes = op.metric("krypton_api_writes_total", cluster="remote", kind="status")
    passes = op.metric("krypton_reconciles_total", cluster="remote")

    def record() -> dict:  # type: ignore[type-arg]
        return fleet.remote.tenant(ns, name)["status"]["clusters"]["remote"]

    wait_for(lambda: record()["chartVersion"] == "0.3.0", 300, what="the upgrade in the window")
    upgraded = dt.datetime.fromisoformat(record()["lastAppliedTime"].replace("Z", "+00:00"))
    assert opens <= upgraded < opens + dt.timedelta(minutes=2)
    fleet.remote.wait_phase(ns, name, "Ready")
    wait_for(lambda: op.metric("krypton_cluster_maintenance_window_open", cluster="remote") == 1,
             15, what="the window gauge open")
    # while it waited nothing was written and no pass ran: the status said it once, and the
    # pass that upgrades came when the window opened (its status: announced and done)
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 1
    assert op.metric("krypton_api_writes_total", cluster="remote", kind="status") <= writes + 2
    assert op.metric("krypton_reconciles_total", cluster="remote") <= passes + 3
