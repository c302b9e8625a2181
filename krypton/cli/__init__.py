"""The command line: ``krypton run|plan|status|register-cluster|crds`` and the fleet tooling
behind plan and status."""
