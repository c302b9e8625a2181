"""krypton's ports to the outside: the Kubernetes API (``kubeapi`` and ``kube``, krypton's
own client), helm (``helm``, the only user of ``pyhelm3``), the chart repository
(``charts``), Events and Prometheus metrics."""
