"""Fixtures live in tests/fixtures/: one module makes the sample histories, one wraps Docker."""

pytest_plugins = [
    "tests.fixtures.samples",
    "tests.fixtures.docker",
    "tests.fixtures.cli",
    "tests.fixtures.ray",
]
