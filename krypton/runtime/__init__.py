"""The running operator's machinery: one worker per engaged cluster with its work queue and
reconciler, the fleet that engages and drains them, the fair helm cap, leader election and
the progressive rollout controller."""
