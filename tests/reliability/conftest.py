"""The reliability suite reuses the integration fixtures (real control planes, real helm)."""

from tests.integration.conftest import (  # noqa: F401 - fixtures
    fleet,
    home_cluster,
    pytest_runtest_makereport,
    remote_cluster,
)
