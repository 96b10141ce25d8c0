"""Fixtures live in tests/fixtures/: one module makes the sample histories, one wraps Docker.

Property tests draw the same examples every run (`make test` must not pass or fail by luck) and
have no deadline (a 2-core machine running Docker builds times nothing reliably). To search new
examples, run with HYPOTHESIS_PROFILE=explore.
"""

import os

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
