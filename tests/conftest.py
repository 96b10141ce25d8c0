"""Fixtures live in tests/fixtures/: one module makes the sample histories, one wraps Docker.

Property tests draw the same examples every run (`make test` must not pass or fail by luck) and
have no deadline (a 2-core machine running Docker builds times nothing reliably). To search new
examples, run with HYPOTHESIS_PROFILE=explore.
"""

import os
import signal

from hypothesis import settings

settings.register_profile("suite", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

pytest_plugins = [
    "tests.fixtures.samples",
    "tests.fixtures.docker",
    "tests.fixtures.cli",
    "tests.fixtures.ray",
]


def pytest_configure() -> None:
    """pytest-xdist's workers start with SIGINT ignored (Ctrl-C is the controller's to handle),
    and so would every command they start: the tests of Ctrl-C need it as a terminal gives it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        signal.signal(signal.SIGINT, signal.default_int_handler)
