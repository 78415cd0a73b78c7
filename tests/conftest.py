"""Root conftest: registers the shared fixture modules under tests/fixtures/, and the Hypothesis
profiles: ``ci`` (the default: a fixed seed, no example database, the property tests' budget of
about 3 minutes in all) and ``fuzz`` (``make fuzz``: fresh random examples, 50 times as many)."""

from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.fixtures.images",
    "tests.fixtures.servers",
    "tests.fixtures.prefect",
]

# No deadline: the machine is shared, and a time limit per example would make the tests timed.
# A hang still fails: pytest-timeout bounds every test (pyproject.toml).
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, database=None, max_examples=100, **_COMMON)
settings.register_profile("fuzz", max_examples=5000, **_COMMON)
settings.load_profile("ci")
