"""krypton's ports to the outside: the Kubernetes API (``kube``, the only user of the
``kubernetes`` package), helm (``helm``, the only user of ``pyhelm3``), the chart repository
(``charts``), Events and Prometheus metrics."""
