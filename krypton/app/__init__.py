"""The operator process: watch cluster, self cluster, discovery, health and metrics servers,
logging, signals and shutdown."""
