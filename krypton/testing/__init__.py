"""Local test bed for krypton and for anyone testing against it (SPEC T1-T3).

Public API:

- :class:`ControlPlane` - a real etcd + kube-apiserver (+ kube-controller-manager) on
  loopback, with generated certificates and an admin kubeconfig.
- :class:`ChartRepository` - charts packaged by a real helm and served over HTTP.
- :func:`testbin` - the directory holding the pinned tool binaries, built on first use.
- :class:`BlackHole` - a loopback listener that accepts TCP and never answers.
"""

from .chartrepo import ChartRepository
from .controlplane import BlackHole, ControlPlane, ControlPlaneError, free_port
from .testbin import testbin

__all__ = ["BlackHole", "ChartRepository", "ControlPlane", "ControlPlaneError", "free_port",
           "testbin"]
