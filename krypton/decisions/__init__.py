"""What should happen, decided without I/O: the Tenant model, the planner, conditions,
fingerprints, rollout waves, settings, kubeconfig checks, the error tree. Everything here is
pure and unit-tested exhaustively; no module imports a client, a process or a clock it was not
given."""
