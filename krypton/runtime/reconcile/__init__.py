"""One reconcile pass of one Tenant on one cluster, in Flux helm-controller's shape: observe
and decide (:mod:`.view`, the pure planner), one action per module, one status writer.

    loop       Reconciler: decide -> act -> one status write, also when the action raised
    view       ClusterView (observe + the needs loop, shared with ``krypton plan``),
               ClusterRuntime (what a reconcile acts with), fenced
    model      Pass, Report, the Tenant read model (tenant_view)
    install    install / upgrade, with the recovery of what an interrupted run left
    revert     the rollback of a halted rollout's failed release
    uninstall  uninstall on deletion, or only the finalizer for another Tenant's release
    reports    the actions that start no helm, and the reports of a failure
    look       an applied release's objects and workload health
    status     the only writer of the Tenant: status, finalizer, fingerprint annotation
"""

from krypton.decisions.verdicts import Outcome
from krypton.runtime.reconcile.loop import Reconciler
from krypton.runtime.reconcile.model import namespace_state, tenant_view
from krypton.runtime.reconcile.view import ClusterRuntime, ClusterView, fenced

__all__ = ["ClusterRuntime", "ClusterView", "Outcome", "Reconciler", "fenced",
           "namespace_state", "tenant_view"]
