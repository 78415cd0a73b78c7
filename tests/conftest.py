"""Root conftest: registers the shared fixture modules under tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.images",
    "tests.fixtures.servers",
    "tests.fixtures.prefect",
]
