"""How a change goes through the fleet: the progressive rollout, its gates and a person's
control of it, maintenance windows, and when a workload is ready. Pure.
"""
