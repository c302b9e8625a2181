"""When a release's workloads are ready (SPEC F6, F8): kstatus-like rules for the kinds krypton
knows, and CEL rules for a chart's own kinds. Pure; read by the model, the settings, the
runtime's readiness and the rollout alike, so below all of them."""
