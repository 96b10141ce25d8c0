"""The no-op check: wheels compared by the files inside, not by their zip bytes or metadata."""

from __future__ import annotations

import zipfile
from pathlib import Path

from runner.ledger import Attempt
from runner.noop import identical_build, wheel_content_digest
from runner.search import Verdict
from tests.fixtures.attempts import recorded


def wheel(path: Path, version: str, code: str, stamp: tuple) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in (
            ("pypto/__init__.py", code),
            (f"pypto-{version}.dist-info/METADATA", f"Name: pypto\nVersion: {version}\n"),
            (f"pypto-{version}.dist-info/RECORD", f"pypto/__init__.py,{version}\n"),
        ):
            archive.writestr(zipfile.ZipInfo(name, date_time=stamp), text)
    return path


def test_a_rebuild_with_other_timestamps_and_version_has_the_same_contents(tmp_path):
    one = wheel(tmp_path / "a.whl", "0.3.0", "FACTOR = 1.0\n", (2024, 1, 1, 0, 0, 0))
    two = wheel(tmp_path / "b.whl", "0.4.0", "FACTOR = 1.0\n", (2025, 6, 1, 12, 0, 0))
    changed = wheel(tmp_path / "c.whl", "0.4.0", "FACTOR = 1.001\n", (2025, 6, 1, 12, 0, 0))

    assert one.read_bytes() != two.read_bytes()
    assert wheel_content_digest(one) == wheel_content_digest(two)
    assert wheel_content_digest(one) != wheel_content_digest(changed)


def attempt(contents: str | None, simpler: str | None = None) -> Attempt:
    wheels = {"pypto": contents} if contents else {}
    if simpler is not None:
        wheels["simpler"] = simpler
    return recorded(f"r{contents}", pypto="b" * 40, verdict=Verdict.BAD, wheel_contents=wheels)


def test_only_equal_wheels_and_identical_generated_code_make_a_no_op():
    assert identical_build(attempt("x"), attempt("x"), "pypto", "identical")
    assert not identical_build(attempt("x"), attempt("x"), "pypto", "changed")
    assert not identical_build(attempt("x"), attempt("y"), "pypto", "identical")
    assert not identical_build(attempt(None), attempt(None), "pypto", "identical")
    assert not identical_build(attempt("x"), None, "pypto", "identical")


def test_a_pointer_bump_builds_the_same_pypto_but_not_the_same_pair():
    assert identical_build(attempt("x", "s"), attempt("x", "s"), "pypto", "identical")
    assert not identical_build(attempt("x", "new"), attempt("x", "old"), "pypto", "identical")
    assert not identical_build(attempt("x", "s"), attempt("x"), "pypto", "identical")


def test_a_no_op_culprit_is_flagged_in_the_headline_not_only_in_the_notes():
    from runner.report import ReportFacts, _headline
    from runner.session import LevelResult, Outcome

    outcome = Outcome("pypto", LevelResult("pypto", ["a" * 40, "b" * 40], found=1))
    assert _headline(outcome, ReportFacts()) == "The regression came in with pypto bbbbbbbbbbbb."
    flagged = _headline(outcome, ReportFacts(noop="pypto"))
    assert flagged.startswith("Check before trusting: the regression came in with pypto bbbb")
    assert "its pypto build is identical to its parent's" in flagged
