"""Root conftest: registers the shared fixture modules under tests/fixtures/, and the Hypothesis
profiles: ``ci`` (the default: a fixed seed, no example database, the property tests' budget of
about 3 minutes in all) and ``fuzz`` (``make fuzz``: fresh random examples, 50 times as many)."""

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.fixtures.images",
    "tests.fixtures.servers",
    "tests.fixtures.prefect",
]

# No deadline: the machine is shared, and a time limit per example would make the tests timed.
# A hang still fails: pytest-timeout bounds every test (pyproject.toml).
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
# Only the property tests (tests/h5forge/*/test_documents_properties.py, test_documents.py,
# read/test_ranges.py) take max_examples from the profile; every other @given names its own.
# ci: 1,000 examples a property (tests/fixtures/documents.py:examples gives a slow one a share
# of that), 110 s for all of them (79 s of CPU) on the 2-core machine while a benchmark loaded
# it (load 4), within the budget of about 3 minutes. fuzz: 50 times as many, about an hour.
settings.register_profile("ci", derandomize=True, database=None, max_examples=1000, **_COMMON)
settings.register_profile("fuzz", max_examples=50_000, **_COMMON)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _own_read_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remote reads cache in ``$XDG_CACHE_HOME/h5forge`` by default: each test gets its own,
    so no test reads another's (or the user's) cache. DataLoader workers inherit it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
