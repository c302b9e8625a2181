"""krypton: a Kubernetes operator that rolls one centrally configured Helm chart out to every
Tenant on a fleet of clusters.

Layers (enforced by import-linter, see pyproject.toml): pure decisions (`fingerprint`,
`versions`, `planner`, `conditions`, `model`, `kubeconfig`, `discovery`) below the I/O
modules (`kubeapi` and `kube`, krypton's own client of the Kubernetes API; `helm`, the only
user of `pyhelm3`), below the orchestration (`reconciler`, `worker`, `fleet`, `app`).
"""

__version__ = "0.1.0"
