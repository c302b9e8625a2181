"""Which clusters krypton serves and how it reaches them: discovery, kubeconfigs and their
credentials, the pod's own identity, shards. Pure.
"""
