"""What the operator remembers of a Tenant goes when the Tenant goes.

Rounds of Tenants made and deleted on one cluster: installed ones, ones that target a cluster
that is not this one, and paused ones. After each round the operator's count of Tenants remembered
(``krypton_tenants_remembered``) is back where it was before any, and its memory does not grow
from one round to the next.
"""

from __future__ import annotations

from krypton.decisions.model import PAUSED_ANNOTATION
from krypton.testing.bench.process import status_field
from krypton.testing.operator import wait_for
from tests.integration.conftest import GROUP, PLURAL, VERSION, Fleet, unique

ROUNDS = 2
INSTALLED, ELSEWHERE, PAUSED = 15, 60, 45  # Tenants of each kind per round
TOTAL = INSTALLED + ELSEWHERE + PAUSED


def test_tenants_remembered_return_to_baseline_after_churn(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    remote, ns = fleet.remote, fleet.tenant_ns
    remote.ensure_namespace(ns)
    op = fleet.start("--max-concurrent-helm", "4")
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 60,
             what="remote engaged")
    baseline = op.metric("krypton_tenants_remembered", cluster="remote")
    assert baseline == 0  # this test's Tenant namespace is its own
    rss = []
    for _ in range(ROUNDS):
        installed = [fleet.tenant(remote, unique("churn-in")) for _ in range(INSTALLED)]
        others = [fleet.tenant(remote, unique("churn-away"),
                               spec={"clusterRef": {"secretName": "elsewhere"}})
                  for _ in range(ELSEWHERE)]
        others += [fleet.tenant(remote, unique("churn-paused"),
                                annotations={PAUSED_ANNOTATION: "true"}) for _ in range(PAUSED)]
        for name in installed:
            remote.wait_phase(ns, name, "Ready", timeout=180)
        made = installed + others
        wait_for(lambda: op.metric("krypton_tenants_remembered", cluster="remote") == TOTAL,
                 60, what=f"{TOTAL} remembered")
        for name in made:
            remote.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        wait_for(lambda names=made: all(remote.tenant_gone(ns, n) for n in names), 180,
                 what="the Tenants deleted (their releases uninstalled)")
        wait_for(lambda: op.metric("krypton_tenants_remembered", cluster="remote") == baseline,
                 60, what="the count back to baseline")
        assert op.metric("krypton_tenant_release_info", cluster="remote") == 0
        rss.append(status_field(op.pid, "VmRSS") / 1024)
    print(f"operator RSS after each round: {', '.join(f'{r:.1f}' for r in rss)} MiB")
    # what is left after a round is what a later round reuses, not more of it each time
    assert rss[-1] <= rss[0] + 8.0, rss
