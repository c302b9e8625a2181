"""The chart and what it renders: versions, registries, its CRDs, the fingerprint, what a
change would change, field conflicts and which objects are a release's. Pure.
"""
