"""`tests/suite.py`, which `make test` runs: the split of the suite into two processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.suite import ENGINE, NO_TESTS, combined, sides, split_markexpr


@pytest.mark.parametrize(
    ("args", "rest", "expression"),
    [
        ([], [], None),
        (["-k", "ledger", "tests/test_cli.py"], ["-k", "ledger", "tests/test_cli.py"], None),
        (["-m", "not docker", "-x"], ["-x"], "not docker"),
        (["-me2e"], [], "e2e"),
        (["-m=e2e", "-m", "docker"], [], "docker"),  # the last one wins, as in pytest
        (["--maxfail", "1"], ["--maxfail", "1"], None),
    ],
)
def test_the_users_mark_expression_is_taken_out(args, rest, expression):
    assert split_markexpr(args) == (rest, expression)


def test_both_sides_keep_the_users_expression_and_together_hold_every_test():
    engine, other = sides(["-m", "not e2e", "-k", "cli"])
    assert engine == ["-k", "cli", "-m", f"(not e2e) and ({ENGINE})"]
    assert other == ["-k", "cli", "-m", f"(not e2e) and not ({ENGINE})"]


@pytest.mark.parametrize(
    ("codes", "code"),
    [
        ((0, 0), 0),
        ((0, NO_TESTS), 0),  # `-m docker`: the other side has nothing to run
        ((NO_TESTS, NO_TESTS), NO_TESTS),
        ((NO_TESTS, 1), 1),
        ((1, 0), 1),
        ((2, 1), 2),  # interrupted first
    ],
)
def test_one_exit_code_for_both(codes, code):
    assert combined(codes) == code


def test_a_failure_beside_the_docker_tests_fails_the_run_and_its_output_is_shown(tmp_path):
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.docker\n"
        "def test_engine():\n    pass\n\n"
        "def test_beside():\n    assert 1 == 2, 'beside failed'\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    docker: d\n    ray: r\n")
    result = subprocess.run(
        [sys.executable, "-m", "tests.suite", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 deselected" in result.stdout  # the engine's side
    assert "beside failed" in result.stdout
    assert result.stdout.index("1 passed, 1 deselected") < result.stdout.index("beside failed")
