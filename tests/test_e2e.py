"""Whole bisects through the real CLI, the real Docker Engine and generated histories."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import docker
import pytest

from runner.execute import KIND_LABEL, LABEL, OWNER_LABEL
from runner.history import History
from runner.sample.demo import checkout_wheelhouse, run_arguments
from runner.sample.histories import REGRESSED, SampleSpec, git, make_sample
from tests.fixtures.cli import BASE_IMAGE, cli, rebuilt, run_args
from tests.fixtures.docker import slow_container_removals
from tests.fixtures.index import serving
from tests.fixtures.samples import SMALL, checkout_state

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.timeout(900)]

PYPTO_REGRESSION = SampleSpec(**SMALL, bumps=((4, 4), (6, 5)), pypto_regression_at=5)
SIMPLER_REGRESSION = SampleSpec(**SMALL, bumps=((4, 5), (6, 6)), simpler_regression_at=3)
CODE_AND_POINTER = SampleSpec(
    **SMALL, bumps=((4, 5),), code_with_bump=frozenset({4}), simpler_regression_at=3
)
CODE_HALF = SampleSpec(
    **SMALL, bumps=((4, 5),), code_with_bump=frozenset({4}), pypto_regression_at=4
)
BROKEN_STRETCH = SampleSpec(
    **SMALL, bumps=((6, 5),), pypto_regression_at=5, broken_pypto=frozenset({3, 4})
)
BROKEN_BUMP = SampleSpec(
    **SMALL,
    bumps=((4, 5),),
    code_with_bump=frozenset({4}),
    broken_pypto=frozenset({4}),
    simpler_regression_at=3,
)
# pypto 4 moves simpler 1 -> 6 and takes simpler 3's renamed kernel: neither half imports.
API_BUMP = SampleSpec(
    **SMALL,
    bumps=((4, 6),),
    code_with_bump=frozenset({4}),
    api_change=(3, 4),
    simpler_regression_at=5,
)
# simpler 4, pinned by pypto 4 and 5, has a conflict marker in its pyproject.toml.
UNREADABLE = SampleSpec(
    **SMALL, bumps=((4, 4), (6, 6)), unreadable_simpler=frozenset({4}), simpler_regression_at=6
)
# pypto's build bakes the runtime's include/abi.h into its wheel from pypto 2 on; simpler 3 changes
# the value there, and nothing else: only a pypto built with each state's header can find it.
IN_HEADER = SampleSpec(**SMALL, bumps=((4, 5),), simpler_regression_at=3, regression_in_header=True)
BACKWARD = SampleSpec(
    **{**SMALL, "simpler_commits": 8},
    bumps=((4, 7), (6, 3)),
    simpler_regression_at=2,
    simpler_fixed_at=5,
)


# The confidence search re-tests the boundary until the culprit reaches 95 %, and runs the last
# good commit a third time last (that run is also the drift check at the end).
EXTRA = 4


def max_tests(commits: int) -> int:
    return math.ceil(math.log2(commits))


def test_a_regression_in_pypto_code_is_found_at_its_commit(sample_factory, finished, tmp_path):
    sample = sample_factory(PYPTO_REGRESSION)

    done = finished(sample, to=tmp_path / "work")

    result = done.result
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["source"] == "pypto"
    assert report["pypto"]["first_bad"] == sample.pypto_shas[5]
    assert report["simpler"] is None
    searched = [s for s in report["steps"] if s["level"] != "drift"]
    assert len(searched) <= max_tests(8) + 2 + EXTRA
    assert len(report["steps"]) - len(searched) <= 2, "the drift check re-runs at most two"
    assert report["confidence"]["pypto"]["probability"] >= 0.95
    assert report["triage"]["status"] == "changed"
    assert (checkout_state(sample.pypto), checkout_state(sample.lib)) == done.checkouts_before
    assert report["noop"] is None and report["drift"] == []
    assert report["environment"]["changes"] == []
    md = (tmp_path / "work" / "report.md").read_text()
    assert sample.pypto_shas[5] in md and "git bisect start" in md
    assert "| image the base image tag names now (id) | `sha256:" in md, "not a tag: an id"


def test_a_regression_in_a_simpler_commit_inside_a_bump_is_found_at_the_simpler_commit(
    sample_factory, bisect, tmp_path
):
    sample = sample_factory(SIMPLER_REGRESSION)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["source"] == "simpler"
    assert report["pypto"]["first_bad"] == sample.pypto_shas[4]
    assert report["simpler"]["first_bad"] == sample.simpler_shas[3]
    assert report["simpler"]["culprit"] == sample.simpler_shas[3]
    assert report["simpler"]["range"] == [sample.simpler_shas[1], sample.simpler_shas[5]]
    assert report["simpler"]["direction"] == "forward"
    assert report["triage"]["status"] == "identical"
    simpler_tests = [s for s in report["steps"] if s["level"] == "simpler"]
    assert len(simpler_tests) <= max_tests(4) + EXTRA
    assert report["stats"]["builds"]["simpler"] <= len(report["steps"])
    # Every row of the simpler level's table has a subject, the bump's ends (judged with the
    # pypto level's runs) included.
    table = (tmp_path / "work" / "report.md").read_text().split("### simpler level")[1]
    rows = [row["sha"] for row in report["confidence"]["simpler"]["tested"]]
    assert sample.simpler_shas[1] in rows and sample.simpler_shas[5] in rows
    assert all(f"| `{sha[:12]}` |  |" not in table for sha in rows), "a subject is missing"


def test_a_bump_that_does_not_build_still_names_the_simpler_commit_its_move_brings(
    sample_factory, bisect, tmp_path
):
    # pypto 4 bumps simpler and changes code that fails to compile; pypto 5 fixes the code.
    sample = sample_factory(BROKEN_BUMP)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["source"] == "simpler"
    assert report["pypto"]["first_bad"] == sample.pypto_shas[4]
    assert report["simpler"]["culprit"] == sample.simpler_shas[3]
    assert report["simpler"]["pypto"] == sample.pypto_shas[5]
    skipped = [s for s in report["steps"] if s["verdict"] == "skip"]
    assert [s["pypto"] for s in skipped] == [sample.pypto_shas[4]]
    assert "build failed" in skipped[0]["reason"]
    assert any("the first of them that builds" in note for note in report["notes"])
    # Why the blamed bump has no run of its own, with its build log.
    [untested] = [n for n in report["notes"] if "could not be tested: build failed" in n]
    assert untested.startswith("1 pypto candidate") and skipped[0]["log"] in untested
    markdown = (tmp_path / "work" / "report.md").read_text()
    assert sample.simpler_shas[3] in markdown and "blamed without" in markdown


def test_a_bump_to_a_new_simpler_api_is_bisected_with_its_own_code(sample_factory, bisect):
    sample = sample_factory(API_BUMP)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["pypto"]["first_bad"] == sample.pypto_shas[4]
    assert report["split"]["carrier"] == "unknown"
    assert report["source"] == "simpler"
    assert report["simpler"]["culprit"] == sample.simpler_shas[5]
    assert report["simpler"]["pypto"] == sample.pypto_shas[4]
    halves = [s for s in report["steps"] if s["level"] == "split"]
    assert {s["verdict"] for s in halves} == {"skip"} and len(halves) == 2
    # Across the API line the example cannot import: a skip, never a verdict.
    assert all("accumulate" in s["reason"] for s in halves), [s["reason"] for s in halves]


def test_a_pypto_whose_build_reads_the_runtime_is_built_with_each_simpler_state(
    sample_factory, bisect, tmp_path, shared_cache
):
    sample = sample_factory(IN_HEADER)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["pypto"]["first_bad"] == sample.pypto_shas[4]
    assert report["source"] == "simpler"
    assert report["simpler"]["culprit"] == sample.simpler_shas[3]
    # One pypto wheel per simpler state, each baking that state's header.
    ledger = json.loads((tmp_path / "work" / "ledger.json").read_text())
    inside = [a for a in ledger["attempts"] if a["level"] == "simpler"]
    wheels = {a["simpler_sha"]: a["wheel_digests"]["pypto"] for a in inside}
    assert len(wheels) >= 2 and len(set(wheels.values())) == len(wheels), wheels
    listed = cli("cache", "ls", "--cache-dir", str(shared_cache), "--json").json()
    built_with = {
        row["inputs"]["runtime"]
        for row in listed
        if row["package"] == "pypto" and row["commit"] == sample.pypto_shas[4] and row["inputs"]
    }
    assert set(wheels) - {sample.gitlink(4)} <= built_with, (wheels, built_with)


@pytest.mark.parametrize("requirement", ["ninja==0.1", "ninja>=99"])
def test_a_commit_whose_build_tools_nothing_supplies_can_be_skipped(
    sample_factory, bisect, requirement
):
    """==0.1: no wheel to download; >=99: no release satisfies it when the tools are resolved."""
    sample = sample_factory(PYPTO_REGRESSION)
    middle = sample.pypto_shas[3]
    pin = {"package": "pypto", "commits": [middle], "requirements": [requirement]}

    refused = bisect(sample, "--build-pin", json.dumps(pin))

    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert requirement in last and last.endswith(f"--skip {middle[:12]} takes it as untestable"), (
        last
    )
    assert "cannot reach" not in last
    skipped = bisect(sample, "--build-pin", json.dumps(pin), "--skip", middle)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.json()["pypto"]["first_bad"] == sample.pypto_shas[5]


def test_a_requirement_no_release_satisfies_in_the_range_names_it_and_offers_skip(
    sample_factory, bisect, tmp_path
):
    """A commit of the range whose pyproject asks for a release nothing has (a later commit
    reverts it): that is said, with --skip, not blamed on a package index that answered."""
    sample = sample_factory(PYPTO_REGRESSION)
    pypto = tmp_path / "pypto"
    shutil.copytree(sample.pypto, pypto, symlinks=True)
    pyproject = pypto / "pyproject.toml"
    before = pyproject.read_text()
    assert 'requires = ["setuptools"]' in before
    pyproject.write_text(
        before.replace('requires = ["setuptools"]', 'requires = ["setuptools>=999"]')
    )
    git(pypto, "commit", "-q", "-am", "needs a setuptools from the future", when=400 * 86_400)
    wanting = git(pypto, "rev-parse", "HEAD").strip()
    pyproject.write_text(before)
    git(pypto, "commit", "-q", "-am", "back to any setuptools", when=401 * 86_400)

    refused = bisect(dataclasses.replace(sample, pypto=pypto))

    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert f"pypto {wanting[:12]}: no release of setuptools" in last, last
    assert "satisfies the build requirement 'setuptools>=999'" in last, last
    assert last.endswith(f"--skip {wanting[:12]} takes it as untestable"), last


@pytest.mark.timeout(900)
def test_a_requirement_an_answering_index_has_no_release_for_is_a_skip_between_the_ends(
    sample_factory, shared_cache, tmp_path
):
    """Without a wheelhouse the tools come from an index. When it has the project but no
    release the commit asks for, the commit cannot be built as it is (a wheelhouse may just
    lack the release: above, the run stops). Its tests are skips, said before the first step,
    and the run goes on: here to the two commits the skip leaves, exit 1."""
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),)))  # every commit passes
    pypto = tmp_path / "pypto"
    shutil.copytree(sample.pypto, pypto, symlinks=True)
    good = git(pypto, "rev-parse", "HEAD").strip()
    pyproject, code = pypto / "pyproject.toml", pypto / "pypto" / "__init__.py"
    before = pyproject.read_text()
    pyproject.write_text(
        before.replace('requires = ["setuptools"]', 'requires = ["setuptools>=999"]')
    )
    git(pypto, "commit", "-q", "-am", "needs a setuptools from the future", when=400 * 86_400)
    wanting = git(pypto, "rev-parse", "HEAD").strip()
    pyproject.write_text(before)
    code.write_text(code.read_text().replace("FACTOR = 1.0\n", f"FACTOR = {REGRESSED!r}\n"))
    git(pypto, "commit", "-q", "-am", "back to any setuptools, and a regression", when=401 * 86_400)
    bad = git(pypto, "rev-parse", "HEAD").strip()
    wheels = checkout_wheelhouse()
    args = run_arguments(
        pypto=pypto,
        lib=sample.lib,
        good=good,
        workdir=tmp_path / "work",
        cache=shared_cache,
        base_image=BASE_IMAGE,
        wheelhouse=tmp_path / "no-wheelhouse",
    )
    assert "--wheelhouse" not in args

    with serving(wheels, {}) as index:
        result = cli(*args, "--json", env=index.pip_environment())

    assert result.returncode == 1, result.stderr
    assert f"warning: pypto {wanting[:12]} cannot be built (no release of setuptools" in (
        " ".join(result.stderr.split())
    ), result.stderr
    report = result.json()
    assert report["pypto"]["candidates"] == [wanting, bad]
    (step,) = [s for s in report["steps"] if s["pypto"] == wanting]
    assert step["verdict"] == "skip"
    assert step["reason"].startswith("build failed: pypto (no release of setuptools in the "), step
    assert "'setuptools>=999'" in step["reason"]


def test_a_simpler_commit_whose_pyproject_is_not_toml_is_a_skip_not_the_end(sample_factory, bisect):
    sample = sample_factory(UNREADABLE)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["pypto"]["first_bad"] == sample.pypto_shas[6]
    assert report["simpler"]["culprit"] == sample.simpler_shas[6]
    unreadable = [s for s in report["steps"] if s["simpler"] == sample.simpler_shas[4]]
    assert all(s["verdict"] == "skip" for s in unreadable)
    assert all(
        s["reason"].startswith("build failed: simpler (pyproject.toml is not valid TOML")
        for s in unreadable
    ), [s["reason"] for s in unreadable]


def test_a_backward_bump_that_drops_a_fix_blames_the_dropped_commit(
    sample_factory, bisect, tmp_path
):
    sample = sample_factory(BACKWARD)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["source"] == "simpler"
    assert report["pypto"]["first_bad"] == sample.pypto_shas[6]
    assert report["simpler"]["direction"] == "backward"
    assert report["simpler"]["first_bad"] == sample.simpler_shas[4]
    culprit = sample.simpler_shas[5]
    assert report["simpler"]["culprit"] == culprit
    # The figures, the runner-up and `status` name the dropped commit too, not the first bad
    # state (the runner-up was the culprit itself).
    runner_up = report["confidence"]["simpler"]["runner_up"]
    assert runner_up is not None and runner_up["sha"] != culprit
    marked = [
        line
        for line in (tmp_path / "work" / "report.md").read_text().splitlines()
        if "**culprit**" in line
    ]
    assert any(f"`{culprit[:12]}`" in line for line in marked), marked
    assert not any(f"`{sample.simpler_shas[4][:12]}`" in line for line in marked), marked
    status = cli("status", "--workdir", str(tmp_path / "work"), "--json")
    simpler = status.json()["levels"][1]
    assert simpler["likeliest"] == culprit and simpler["likeliest_removed"] is True


def test_a_culprit_changing_code_and_pointer_is_split_and_descends_into_simpler(
    sample_factory, bisect
):
    sample = sample_factory(CODE_AND_POINTER)

    report = bisect(sample).json()

    assert report["pypto"]["first_bad"] == sample.pypto_shas[4]
    assert report["pypto"]["change"]["kind"] == "pointer-and-code"
    assert report["split"]["carrier"] == "pointer"
    assert report["source"] == "simpler"
    assert report["simpler"]["culprit"] == sample.simpler_shas[3]


def test_a_culprit_whose_code_half_regresses_stays_in_pypto(sample_factory, bisect):
    sample = sample_factory(CODE_HALF)

    result = bisect(sample)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["source"] == "pypto"
    assert report["pypto"]["first_bad"] == sample.pypto_shas[4]
    assert report["split"]["carrier"] == "code"
    assert report["simpler"] is None


def test_a_broken_build_stretch_next_to_the_culprit_is_inconclusive_with_the_range(
    sample_factory, bisect, tmp_path
):
    sample = sample_factory(BROKEN_STRETCH)

    result = bisect(sample)

    assert result.returncode == 1, result.stderr
    report = result.json()
    assert report["source"] == "inconclusive"
    assert report["pypto"]["first_bad"] is None
    assert report["pypto"]["candidates"] == sample.pypto_shas[3:6]
    skipped = [s for s in report["steps"] if s["verdict"] == "skip"]
    assert skipped and all("build failed" in s["reason"] for s in skipped)
    # Each failed build's log is kept beside its attempt (the cache's copy may be pruned), and
    # the note on the untested candidates points at one.
    runs = tmp_path / "work" / "runs"
    for step in skipped:
        log = Path(step["log"])
        assert log.parent.parent == runs and log.name.startswith("build-") and log.stat().st_size
    [note] = [n for n in report["notes"] if "could not be tested: build failed" in n]
    assert f"(log: {runs}" in note
    # Reproducing a build failure builds again: the cache's recorded failure proves nothing.
    again = cli("reproduce", "--workdir", str(tmp_path / "work"), skipped[0]["run_id"])
    assert again.returncode == 0 and "the verdict reproduces" in again.stdout, again.stderr
    rebuilt = json.loads((tmp_path / "work" / "reproductions" / "ledger.json").read_text())
    assert "failed" in rebuilt["attempts"][-1]["builds"].values(), rebuilt["attempts"][-1]


def test_a_known_good_commit_that_fails_stops_with_exit_3(sample_factory, bisect, tmp_path):
    sample = sample_factory(PYPTO_REGRESSION)

    result = bisect(sample, "--good", sample.pypto_shas[6])

    assert result.returncode == 3
    assert "known-good commit" in result.stderr
    assert "environment" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert report["exit_code"] == 3 and report["pypto"]["first_bad"] is None
    assert result.json() == report, "--json prints the report on stdout whatever the exit code"
    steps = report["steps"]
    assert steps and {s["pypto"] for s in steps} == {sample.pypto_shas[6]}, (
        "nothing is bisected once an endpoint fails; only the endpoint is re-run"
    )
    # status says so, and shows no range: nothing was bisected.
    status = cli("status", "--workdir", str(tmp_path / "work"))
    assert "stopped: the known-good endpoint did not reproduce" in status.stdout, status.stdout
    assert "candidate" not in status.stdout
    assert (
        cli("status", "--workdir", str(tmp_path / "work"), "--json").json()["endpoint_failure"]
        == "good"
    )


# HEAD pins simpler 1, from before simpler vendored pto-isa, so the checkout never fetched isa;
# commits 4 and 5 pin simpler 5, which has it.
ISA_IN_THE_MIDDLE = SampleSpec(**SMALL, bumps=((4, 5), (6, 1)), pypto_regression_at=5)


def test_sources_the_checkout_lacks_stop_at_an_endpoint_and_are_tested_once_fetched(
    sample_factory, bisect, shared_cache, tmp_path
):
    shared = sample_factory(ISA_IN_THE_MIDDLE)
    copy = tmp_path / "pypto"
    shutil.copytree(shared.pypto, copy, symlinks=True)
    sample = dataclasses.replace(shared, pypto=copy)
    isa_store = copy / ".git" / "modules" / "simpler" / "modules" / "third_party" / "isa"
    assert not isa_store.exists()
    ledger = tmp_path / "work" / "ledger.json"

    # The known-bad commit's simpler is missing: bad input, found before anything is built.
    aside = tmp_path / "simpler-module"
    shutil.move(copy / ".git" / "modules" / "simpler", aside)
    stopped = bisect(sample)
    assert stopped.returncode == 2, stopped.stderr
    assert stopped.stderr.startswith("error: the known-bad commit ")
    assert "source unavailable: submodule runtime commit" in stopped.stderr
    assert len(stopped.stderr.strip().splitlines()) == 1
    # Nothing was tested: no ledger holds the workdir for these inputs (the corrected command
    # must not be told the workdir belongs to another session).
    assert not ledger.exists(), "bad input is not a session run"
    shutil.move(aside, copy / ".git" / "modules" / "simpler")

    # Commits 4 and 5 need isa: skipped, so the boundary is one of three commits.
    partial = bisect(sample)
    assert partial.returncode == 1, partial.stderr
    assert partial.json()["pypto"]["candidates"] == sample.pypto_shas[4:7]
    skips = [a for a in json.loads(ledger.read_text())["attempts"] if a["verdict"] == "skip"]
    assert skips and all(a["reason"].startswith("source unavailable: ") for a in skips)
    why = (
        "2 pypto candidates could not be tested: source unavailable: "
        "submodule runtime/third_party/isa"
    )
    assert any(note.startswith(why) for note in partial.json()["notes"])
    # Run again as it is, without --json: the summary says why, and nothing new is tested.
    again = cli(*run_args(sample, tmp_path / "work", shared_cache))
    assert again.returncode == 1 and f"note: {why}" in again.stdout
    # Each candidate with its subject, as the report lists them.
    for sha in sample.pypto_shas[4:7]:
        subject = git(copy, "log", "-1", "--format=%s", sha).strip()
        assert f"  {sha} {subject}\n" in again.stdout, again.stdout
    assert (
        partial.json()["pypto"]["candidate_subjects"][sample.pypto_shas[4]]
        == git(copy, "log", "-1", "--format=%s", sample.pypto_shas[4]).strip()
    )
    assert len(json.loads(ledger.read_text())["attempts"]) == len(partial.json()["steps"])
    before = ledger.read_text()
    typo = cli(*run_args(sample, tmp_path / "work", shared_cache), "--wheelhouse", "/no/such")
    assert typo.returncode == 2 and ledger.read_text() == before

    # Fetched as the message asks: the same command tests them and names the culprit.
    git(tmp_path, "clone", "-q", "--bare", str(shared.mirrors["isa"]), str(isa_store))
    fetched = bisect(sample)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.json()["pypto"]["first_bad"] == sample.pypto_shas[5]
    document = json.loads(ledger.read_text())
    assert set(document["superseded"]) == {a["run_id"] for a in skips}
    marked = {s["run_id"] for s in fetched.json()["steps"] if s["superseded"]}
    assert marked == set(document["superseded"])
    assert "| skip (superseded) |" in (tmp_path / "work" / "report.md").read_text()


def test_a_known_bad_end_whose_pin_moved_after_the_good_end_has_its_own_pin_checked(
    sample_factory, bisect, tmp_path
):
    # The checkout's simpler store ends before the last bump's pointer: the known-bad commit's
    # pin is missing, the known-good commit's is there, and the pointer moved in between.
    shared = sample_factory(SIMPLER_REGRESSION)
    copy = tmp_path / "pypto"
    shutil.copytree(shared.pypto, copy, symlinks=True)
    sample = dataclasses.replace(shared, pypto=copy)
    module = copy / ".git" / "modules" / "simpler"
    kept = tmp_path / "kept"
    shutil.move(module / "modules", kept)
    shutil.copy(module / "config", tmp_path / "config")
    shutil.rmtree(module)
    git(tmp_path, "init", "-q", "--bare", str(module))
    last_bump = max(sample.spec.bump_indices)
    before = sample.gitlink(last_bump - 1)
    git(module, "fetch", "-q", str(sample.mirrors["simpler"]), f"{before}:refs/heads/kept")
    shutil.copy(tmp_path / "config", module / "config")
    shutil.move(kept, module / "modules")
    good = sample.pypto_shas[3]  # before the regressing bump; its pin is older still
    assert sample.gitlink(3) not in (None, before, sample.gitlink(len(sample.pypto_shas) - 1))

    stopped = bisect(sample, "--good", good)

    assert stopped.returncode == 2, stopped.stderr
    assert stopped.stderr.startswith("error: the known-bad commit ")
    assert not (tmp_path / "work" / "ledger.json").exists(), "nothing tested: no ledger kept"


# The sample draws its lies from the seed and each attempt's run number: with one device a session
# lies the same way every time, so this test cannot pass or fail by luck.
FLAKY = ("SAMPLE_FALSE_FAIL=0.1", "SAMPLE_FALSE_PASS=0.1", "SAMPLE_FLAKE_SEED=8")


def test_an_example_that_lies_ten_percent_of_the_time_still_names_the_culprit_with_confidence(
    sample_factory, bisect, tmp_path
):
    sample = sample_factory(PYPTO_REGRESSION)
    flags = [arg for env in FLAKY for arg in ("--run-env", env)]

    result = bisect(sample, *flags)

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["pypto"]["first_bad"] == sample.pypto_shas[5]
    confidence = report["confidence"]["pypto"]
    assert confidence["probability"] >= 0.95
    assert confidence["runner_up"]["probability"] < 0.05
    counts = {row["sha"]: (row["passes"], row["fails"]) for row in confidence["tested"]}
    # Every run of a pypto commit at its own pointer counts, whichever stage recorded it (a
    # lie can steer the search into a bump, whose chain runs them again); drift re-runs do not.
    pins = {sha: History(sample.pypto).gitlink(sha) for sha in sample.pypto_shas}
    own = [s for s in report["steps"] if s["level"] != "drift" and s["simpler"] == pins[s["pypto"]]]
    assert sum(p + f for p, f in counts.values()) == len(own)
    bad = {sha: index >= 5 for index, sha in enumerate(sample.pypto_shas)}
    lies = [
        run["run_id"]
        for run in _attempts(tmp_path / "work")
        if run["level"] == "pypto" and (run["verdict"] == "bad") != bad[run["pypto_sha"]]
    ]
    assert lies, "the example told the truth every time: nothing here tests a lie"
    table = (tmp_path / "work" / "report.md").read_text().split("## Confidence")[1]
    assert all(f"| `{sha[:12]}` |  |" not in table for sha in counts), "a subject is missing"


def _attempts(workdir: Path) -> list[dict]:
    try:
        return json.loads((workdir / "ledger.json").read_text())["attempts"]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_a_run_killed_mid_way_resumes_without_rerunning_or_rebuilding_anything(
    sample_factory, shared_cache, tmp_path, docker_client
):
    sample = sample_factory(SIMPLER_REGRESSION)
    workdir = tmp_path / "work"
    cache = tmp_path / "own-cache"  # a cold cache, so the killed run is mid-build or mid-run
    args = [sys.executable, "-m", "runner.cli", *run_args(sample, workdir, cache), "--json"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while len(_attempts(workdir)) < 2 and time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.2)
    time.sleep(1.5)  # well inside the next attempt
    running = cli("status", "--workdir", str(workdir), "--cache-dir", str(cache), "--json")
    assert running.json()["state"].startswith("in progress: next "), running.stdout
    shown = cli("report", "--workdir", str(workdir), "--cache-dir", str(cache))
    assert shown.returncode == 0, shown.stderr
    assert "The bisect is in progress: a `run` holds this workdir" in shown.stdout
    assert not (workdir / "report.md").exists(), "report wrote over what the run writes"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    recorded = _attempts(workdir)
    assert len(recorded) >= 2
    status = cli("status", "--workdir", str(workdir), "--cache-dir", str(cache), "--json")
    assert status.returncode == 0, status.stderr
    assert status.json()["finished"] is False
    assert status.json()["attempts"] == len(recorded)

    pending = status.json()["state"]
    assert pending.startswith("stopped before the end (no run holds the workdir): next ")
    assert pending.endswith("rerun the same command to resume")

    result = cli(*run_args(sample, workdir, cache), "--json")

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["simpler"]["culprit"] == sample.simpler_shas[3]
    after = _attempts(workdir)
    assert after[: len(recorded)] == recorded
    resumed = after[len(recorded)]
    assert (
        f"of {resumed['pypto_sha'][:12]} with simpler {(resumed['simpler_sha'] or 'none')[:12]}"
        in pending
    ), "the resumed run went on with another test than the one status said was next"
    assert rebuilt(recorded, after[len(recorded) :]) == []
    # The killed run's containers are gone (the resumed run removed them); other live runs on
    # the same engine keep theirs.
    killed = f"{socket.gethostname()}:{process.pid}"
    leftovers = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL}=1"}, ignore_removed=True
    )
    assert [c.name for c in leftovers if c.labels.get(OWNER_LABEL) == killed] == []


def test_a_session_of_a_range_before_the_runtime_was_added_reproduces_and_exports(
    sample_factory, bisect, tmp_path
):
    """pypto older than its runtime submodule (all of it before April 2026): `run` bisected it,
    but `reproduce` and `export` took the default --submodule-path read back from the
    session's settings as set on purpose, and refused the range."""
    spec = SampleSpec(
        **{**SMALL, "runtime_added_at": 6, "nested_submodule_at": 6},
        bumps=(),
        pypto_regression_at=3,
    )
    sample = sample_factory(spec)
    done = bisect(sample, "--bad", sample.pypto_shas[4])
    assert done.returncode == 0, done.stderr
    assert done.json()["pypto"]["first_bad"] == sample.pypto_shas[3]

    culprit_run = done.json()["reproduce"].split()[-1]
    again = cli("reproduce", "--workdir", str(tmp_path / "work"), culprit_run)
    assert again.returncode == 0, again.stderr
    assert "the verdict reproduces" in again.stdout
    bundle = tmp_path / "bundle"
    exported = cli("export", culprit_run, "--workdir", str(tmp_path / "work"), "--to", str(bundle))
    assert exported.returncode == 0, exported.stderr
    assert (bundle / "run.sh").is_file()


def test_status_report_log_reproduce_and_cache_on_a_finished_session(
    sample_factory, finished, tmp_path, shared_cache
):
    sample = sample_factory(PYPTO_REGRESSION)
    workdir = tmp_path / "work"
    done = finished(sample, to=workdir).result
    assert done.returncode == 0

    culprit_run = done.json()["reproduce"].split()[-1]
    again = cli("reproduce", "--workdir", str(workdir), culprit_run)
    assert again.returncode == 0, again.stderr
    assert "the verdict reproduces" in again.stdout
    # In another cache (the session's moved, or a clean-room check): built there, the same.
    elsewhere = tmp_path / "other-cache"
    elsewhere.mkdir()
    rebuilt_there = cli(
        "reproduce", "--workdir", str(workdir), "--cache-dir", str(elsewhere), culprit_run
    )
    assert rebuilt_there.returncode == 0, rebuilt_there.stderr
    assert "the verdict reproduces" in rebuilt_there.stdout
    assert "pypto wheel: the recorded file (rebuilt" in rebuilt_there.stdout, rebuilt_there.stdout
    there = cli("cache", "ls", "--cache-dir", str(elsewhere), "--json").json()
    assert {"pypto", "simpler"} <= {entry["package"] for entry in there}
    missing = cli("reproduce", "--workdir", str(workdir), "--cache-dir", str(tmp_path / "no"), "1")
    assert missing.returncode == 2 and missing.stderr.startswith("error: --cache-dir "), missing
    assert missing.stderr.strip().endswith("for a check from cold, create an empty one"), missing
    cached = cli("cache", "ls", "--cache-dir", str(shared_cache), "--json").json()
    assert {"pypto", "simpler"} <= {entry["package"] for entry in cached}
    # One commit built by two builders is two entries: the builder tells them apart.
    assert all(entry["builder"].startswith("sha256:") for entry in cached)
    shown = cli("cache", "ls", "--cache-dir", str(shared_cache)).stdout
    assert f"builder {cached[0]['builder'][7:19]}" in shown
    assert f"MB used {cached[0]['last_used'][:19]} builder" in shown  # a last use, not a build

    status = cli("status", "--workdir", str(workdir), "--json")
    assert status.returncode == 0, status.stderr
    assert status.json()["finished"] is True
    assert status.json()["levels"][0]["likeliest"] == sample.pypto_shas[5]
    shown = cli("status", "--workdir", str(workdir)).stdout
    probability = status.json()["levels"][0]["probability"]
    likeliest = f"likeliest first bad {sample.pypto_shas[5][:12]} ({probability:.1%})"
    assert f"pypto level: {likeliest}" in shown, shown  # as the report says it: 99.x %, not 100 %
    assert shown.splitlines()[0].endswith(" runs, done"), "not 'about 0 steps left'"
    report = cli("report", "--workdir", str(workdir), "--json")
    assert report.json()["pypto"]["first_bad"] == sample.pypto_shas[5]
    log = cli("log", "--workdir", str(workdir))
    assert "git bisect start" in log.stdout
    comments = [line for line in log.stdout.splitlines() if line.startswith("# ")]
    assert len(comments) > 2 and all(not line.endswith("]") for line in comments), (
        "every commit of the log is named with its subject, not only the endpoints"
    )

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(sample.pypto), str(clone)], check=True)
    (tmp_path / "bisect.log").write_text(log.stdout)
    replayed = subprocess.run(
        ["git", "bisect", "replay", str(tmp_path / "bisect.log")],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert f"{sample.pypto_shas[5]} is the first bad commit" in replayed.stdout

    # An attempt edited to a commit outside the range is refused, and the file kept as it is.
    edited = tmp_path / "edited"
    shutil.copytree(workdir, edited)
    ledger = json.loads((edited / "ledger.json").read_text())
    ledger["attempts"][2]["pypto_sha"] = "deadbeef" * 5
    (edited / "ledger.json").write_text(json.dumps(ledger))
    before = (edited / "ledger.json").read_bytes()
    for command in (
        ["status", "--workdir", str(edited)],
        ["report", "--workdir", str(edited)],
        ["log", "--workdir", str(edited)],  # (it printed the edited commit, exit 0)
        run_args(sample, edited, shared_cache),
    ):
        refused = cli(*command)
        assert refused.returncode == 2, refused.stdout
        assert "tests pypto deadbeefdead, which is not in this session's range" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (edited / "ledger.json").read_bytes() == before

    # The workdir moved (a CI artifact downloaded elsewhere): its report, and a reproduction,
    # find the runs and the example's snapshot where they are now (they looked in the old place:
    # "example ... not found in <old workdir>/lib-snapshot/...").
    moved = tmp_path / "moved"
    shutil.move(workdir, moved)
    rewritten = cli("report", "--workdir", str(moved))
    assert rewritten.returncode == 0, rewritten.stderr
    report = (moved / "report.md").read_text()
    assert str(workdir) not in report and "artifacts are missing" not in report, report
    there = cli("reproduce", "--workdir", str(moved), culprit_run)
    assert there.returncode == 0, there.stderr
    assert "the verdict reproduces" in there.stdout
    assert not workdir.exists()

    # What the GitHub workflow uploads of it, without the example's snapshot: reproduce made
    # none and failed ("example ... not found in <artifact>/lib-snapshot/..."). The checkout
    # still holds the session's pypto-lib: its snapshot is made again from it.
    artifact = tmp_path / "artifact"
    for pattern in _uploaded_from_the_workdir():
        for path in moved.glob(pattern.rstrip("/")):
            target = artifact / path.relative_to(moved)
            target.parent.mkdir(parents=True, exist_ok=True)
            copy = shutil.copytree if path.is_dir() else shutil.copy2
            copy(path, target)
    assert (artifact / "ledger.json").is_file() and not (artifact / "lib-snapshot").exists()
    downloaded = cli("reproduce", "--workdir", str(artifact), culprit_run)
    assert downloaded.returncode == 0, downloaded.stderr
    assert "the verdict reproduces" in downloaded.stdout


def _uploaded_from_the_workdir() -> list[str]:
    """The workdir paths `.github/workflows/bisect.yml` uploads as the job's artifact."""
    workflow = (Path(__file__).parents[1] / ".github/workflows/bisect.yml").read_text()
    prefix = "${{ steps.bisect.outputs.workdir }}/"
    paths = [line.strip()[len(prefix) :] for line in workflow.splitlines() if prefix in line]
    assert "ledger.json" in paths, paths
    return [p for p in paths if p]


@pytest.mark.parametrize("presses", [1, 2, 3], ids=["once", "twice", "thrice"])
def test_ctrl_c_mid_run_removes_its_containers_and_keeps_the_ledger(
    sample_factory, tmp_path, docker_client, presses
):
    """Twice: the second Ctrl-C lands while the run removes its containers. Thrice: the run
    ends at once, says so, and `cleanup` removes what it left.

    The run talks to the engine through a relay that holds each container removal 3 s, so the
    presses after the first, 0.5 s apart, land while it cleans up: without it, a run on an idle
    machine at times removed its containers before the third press arrived."""
    sample = sample_factory(dataclasses.replace(PYPTO_REGRESSION, example_seconds=3.0))
    workdir = tmp_path / "work"
    args = [
        sys.executable,
        "-m",
        "runner.cli",
        *run_args(sample, workdir, tmp_path / "cold-cache"),
        "--json",
    ]
    with slow_container_removals(hold=3.0) as engine:
        process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DOCKER_HOST": engine},
        )
        owner = f"{socket.gethostname()}:{process.pid}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert process.poll() is None, "the run ended before it could be interrupted"
            running = docker_client.containers.list(
                filters={"label": f"{OWNER_LABEL}={owner}", "status": "running"},
                ignore_removed=True,
            )
            if _attempts(workdir) and any(c.labels.get(KIND_LABEL) == "example" for c in running):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        for _ in range(presses - 1):
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert _attempts(workdir), "the ledger lost what it held"
    if presses == 3:
        assert "interrupted at once: containers of this run may be left" in stderr, stderr
        cleaned = cli("cleanup")
        assert cleaned.returncode == 0, cleaned.stderr
    else:
        assert "interrupted" in stderr and "resume" in stderr
    left = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL}=1"}, ignore_removed=True
    )
    assert [c.name for c in left if c.labels.get(OWNER_LABEL) == owner] == []


def test_a_run_whose_progress_reader_goes_away_stops_with_141_and_stays_resumable(
    sample_factory, tmp_path, docker_client, shared_cache
):
    """`run ... 2>&1 | head`: the progress lines lose their reader mid-run. The run stops as
    Ctrl-C stops it, with 141 as a tool killed by SIGPIPE (it ended with 1, "inconclusive",
    without a word), and the next run resumes from what the ledger holds."""
    sample = sample_factory(PYPTO_REGRESSION)
    workdir = tmp_path / "work"
    args = [sys.executable, "-m", "runner.cli", *run_args(sample, workdir, shared_cache)]
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ
    )
    assert process.stderr is not None
    owner = f"{socket.gethostname()}:{process.pid}"
    for line in process.stderr:  # the first verdict, then the reader leaves
        if line.lstrip().startswith(("good ", "bad ")):
            break
    process.stderr.close()
    process.wait(timeout=600)

    assert process.returncode == 141
    recorded = _attempts(workdir)
    assert recorded, "the ledger lost what it held"
    left = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL}=1"}, ignore_removed=True
    )
    assert [c.name for c in left if c.labels.get(OWNER_LABEL) == owner] == []
    resumed = cli(*run_args(sample, workdir, shared_cache), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["pypto"]["first_bad"] == sample.pypto_shas[5]
    assert _attempts(workdir)[: len(recorded)] == recorded


TWO_STEPS = SampleSpec(
    **SMALL, bumps=((4, 4), (6, 5)), pypto_regression_at=3, simpler_regression_at=5
)


def test_report_rethreshold_moves_the_culprit_from_the_ledger_without_docker(
    sample_factory, bisect, tmp_path
):
    # abs diff ~0.0039 from pypto 3 (its code), ~0.0078 from pypto 6 (its simpler bump adds one)
    sample = sample_factory(TWO_STEPS)
    workdir = tmp_path / "work"
    no_docker = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}

    rule = ["report", "--workdir", str(workdir), "--rethreshold", "--json"]

    strict = bisect(sample)
    assert strict.returncode == 0, strict.stderr
    assert strict.json()["pypto"]["first_bad"] == sample.pypto_shas[3]

    ahead = cli(*rule, "--max-abs-diff", "0.005", env=no_docker)
    assert ahead.returncode == 0, ahead.stderr
    notes = " ".join(ahead.json()["notes"])
    assert "no container was started" in notes
    assert ahead.json()["finished"] is False and "would test next" in notes
    assert ahead.json()["exit_code"] is None, "no exit code before the bisect has finished"
    headline = (workdir / "rethreshold" / "report.md").read_text()
    assert "Re-judged by max_abs_diff <= 0.005: the ledger lacks tests" in headline
    assert "rerun the same `run` command" not in headline
    # So loose that the known-bad end passes: the headline says that, not "lacks tests".
    loose = cli(*rule, "--max-abs-diff", "1", env=no_docker)
    assert loose.returncode == 0, loose.stderr
    headline = (workdir / "rethreshold" / "report.md").read_text()
    assert (
        f"the known-bad commit {sample.pypto_shas[-1][:12]} passes under these limits" in headline
    ), headline[:600]
    # The session's own reports stay as `run` wrote them: finished, exit 0.
    kept = json.loads((workdir / "report.json").read_text())
    assert (
        kept["finished"] is True
        and kept["exit_code"] == 0
        and kept["notes"] == strict.json()["notes"]
    )

    relaxed = bisect(sample, "--max-abs-diff", "0.005")
    assert relaxed.returncode == 0, relaxed.stderr
    assert relaxed.json()["pypto"]["first_bad"] == sample.pypto_shas[6]
    assert relaxed.json()["simpler"]["culprit"] == sample.simpler_shas[5]
    # Every view shows the verdicts the limits gave, the example's own kept in the reason.
    steps = [s for s in relaxed.json()["steps"] if s["pypto"] == sample.pypto_shas[3]]
    assert steps and all(s["verdict"] == "good" for s in steps), steps
    assert all("(the example: bad" in s["reason"] for s in steps), steps
    assert "good: pass" not in relaxed.stderr

    # The limits of a config file (or the environment) re-judge as the flags do.
    config = tmp_path / "limits.toml"
    config.write_text("max_abs_diff = 0.005\n")
    by_file = cli(*rule, "--config", str(config), env=no_docker)
    assert by_file.returncode == 0, by_file.stderr
    assert by_file.json()["pypto"]["first_bad"] == sample.pypto_shas[6]
    config.write_text('max_abs_diff = "abc"\n')
    refused = cli(*rule, "--config", str(config), env=no_docker)
    assert refused.returncode == 2 and "max_abs_diff" in refused.stderr, refused.stderr

    back = cli(*rule, env=no_docker)
    assert back.returncode == 0, back.stderr
    assert back.json()["pypto"]["first_bad"] == sample.pypto_shas[3]
    again = cli(*rule, "--max-abs-diff", "0.005", env=no_docker)
    assert again.json()["pypto"]["first_bad"] == sample.pypto_shas[6]
    assert again.json()["finished"] is True
    md = (workdir / "rethreshold" / "report.md").read_text()
    assert "![precision figures against commit order](metrics.png)" in md
    assert "| max_abs_diff |" in md
    assert (workdir / "rethreshold" / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    figures = again.json()["figures"]["pypto"]
    assert [p["index"] for p in figures] == sorted(p["index"] for p in figures)
    # Limits under which even the known-bad commit passes find no regression: said so.
    lenient = [*rule, "--max-abs-diff", "1", "--max-rel-diff", "1e9", "--max-mismatch-ratio", "1"]
    nothing = cli(*lenient, env=no_docker)
    assert nothing.returncode == 0, nothing.stderr
    bad = sample.pypto_shas[-1][:12]
    assert any(
        note.startswith(f"under these thresholds the known-bad commit {bad} passes")
        for note in nothing.json()["notes"]
    ), nothing.json()["notes"]
    assert not any("known-bad commit" in n and "passes" in n for n in again.json()["notes"])


def test_a_base_image_retagged_mid_session_is_warned_about_at_once_and_reported(
    sample_factory, shared_cache, tmp_path, docker_client
):
    sample = sample_factory(PYPTO_REGRESSION)
    original = docker_client.images.get(BASE_IMAGE)
    repository = f"bisect-precision-fingerprint-{os.getpid()}"
    original.tag(repository, "base")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {original.id}\nRUN echo retagged > /etc/bisect-fingerprint-test\n"
    )
    other, _ = docker_client.images.build(path=str(tmp_path / "ctx"), rm=True, forcerm=True)
    workdir = tmp_path / "work"
    # --json, as a CI runner would: stdout carries the JSON, the warning still reaches stderr.
    args = run_args(sample, workdir, shared_cache, "--base-image", f"{repository}:base", "--json")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "runner.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + 600
        while len(_attempts(workdir)) < 2 and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1]
            time.sleep(0.1)
        retagged_after = len(_attempts(workdir))
        other.tag(repository, "base")
        stdout, stderr = process.communicate(timeout=600)
    finally:
        for name in (f"{repository}:base", other.id):  # only what this test made
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(name, force=True)

    assert process.returncode == 0, stderr
    assert "warning: the base image tag now names another image" in stderr
    assert "pypto level" not in stderr  # --json keeps the progress out, not the warnings
    report = json.loads((workdir / "report.json").read_text())
    assert json.loads(stdout)["pypto"]["first_bad"] == report["pypto"]["first_bad"]
    changes = report["environment"]["changes"]
    keys = {change["key"] for change in changes}
    # The tag moved, but the session kept building on the image it started with, and says so.
    assert "base_image_tag" in keys and "base_image_id" not in keys
    assert {a["fingerprint"]["base_image_id"] for a in _attempts(workdir)} == {original.id}
    change = next(c for c in changes if c["key"] == "base_image_tag")
    assert (change["old"], change["new"]) == (original.id, other.id)
    runs = [a["run_id"] for a in _attempts(workdir)]
    assert runs.index(change["first_run_after"]) >= retagged_after - 1
    assert runs.index(change["last_run_before"]) == runs.index(change["first_run_after"]) - 1
    latest = report["environment"]["latest"]
    assert {"pip_freeze", "kernel", "device", "driver", "cann", "test_image_id"} <= set(latest)
    assert "the base image tag now names another image" in (workdir / "report.md").read_text()


NO_REGRESSION = SampleSpec(**SMALL, bumps=((4, 4), (6, 5)))


def test_a_verdict_flip_on_a_docs_only_commit_is_a_no_op_build_and_the_drift_check_catches_it(
    sample_factory, shared_cache, tmp_path
):
    """The host drifts mid-session and every run fails from then on (as goldens do when the
    host's BLAS changes): the docs-only commit tested after the change is named, its build
    equals its parent's, and the known-good commit re-run at the end fails too: exit 3, reports
    written."""
    sample = sample_factory(NO_REGRESSION)
    pypto, lib = tmp_path / "pypto", tmp_path / "lib"
    shutil.copytree(sample.pypto, pypto, symlinks=True)  # the sample itself is never written
    shutil.copytree(sample.lib, lib, symlinks=True)
    (pypto / "docs").mkdir()
    (pypto / "docs" / "notes.md").write_text("release notes\n")
    git(pypto, "add", "docs")
    git(pypto, "commit", "-q", "-m", "docs: release notes", when=86_400 * 400)
    docs_only = git(pypto, "rev-parse", "HEAD")
    host = tmp_path / "host"  # stands in for a host directory the runs mount (ptoas here)
    host.mkdir()
    state = host / "state"
    workdir = tmp_path / "work"
    args = run_args(
        sample,
        workdir,
        shared_cache,
        *("--pypto", str(pypto), "--lib", str(lib), "--ptoas-root", str(host)),
        *("--run-env", f"SAMPLE_HOST_STATE={state}"),
    )
    args[args.index("--good") + 1] = sample.pypto_shas[-1]
    process = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not _attempts(workdir) and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.05)
    state.write_text("drifted\n")
    stdout, stderr = process.communicate(timeout=600)

    assert process.returncode == 3, stderr
    assert stdout, stderr
    report = json.loads(stdout)
    assert report["pypto"]["first_bad"] == docs_only
    assert report["noop"] == "pypto"
    assert report["triage"]["status"] == "identical"
    assert "both runs had the same runtime" in report["triage"]["summary"]  # not simpler's doing
    assert report["drift"] and "known-good" in report["drift"][0]
    md = (workdir / "report.md").read_text()
    assert "the culprit's build is identical to its parent's" in md
    assert md.splitlines()[2].startswith("Not trusted: the environment drifted")
    drift_runs = [a for a in _attempts(workdir) if a["level"] == "drift"]
    assert drift_runs and drift_runs[0]["pypto_sha"] == sample.pypto_shas[-1]


def test_a_culprit_that_adds_the_runtime_says_so_in_the_report(
    sample_factory, shared_cache, tmp_path
):
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),), simpler_regression_at=1))
    workdir = tmp_path / "work"

    result = cli(*run_args(sample, workdir, shared_cache), "--json")

    assert result.returncode == 0, result.stderr
    assert result.json()["pypto"]["first_bad"] == sample.pypto_shas[2]
    md = (workdir / "report.md").read_text()
    added = sample.gitlink(2)
    assert f"It adds the `runtime` submodule at `{added[:12]}`" in md, md
    assert "pointer `none`" not in md
    assert "adds the runtime submodule: there is no simpler range to bisect" in md


def test_status_of_a_simpler_level_left_with_candidates_says_it_is_inconclusive(
    sample_factory, shared_cache, tmp_path
):
    spec = SampleSpec(
        **SMALL, bumps=((4, 5),), simpler_regression_at=4, broken_simpler=frozenset({3})
    )
    sample = sample_factory(spec)
    workdir = tmp_path / "work"

    ran = cli(*run_args(sample, workdir, shared_cache))
    status = cli("status", "--workdir", str(workdir), "--json")

    assert ran.returncode == 1, ran.stderr
    assert status.json()["state"] == (
        "finished: source simpler, no single simpler commit (inconclusive: exit 1)"
    )


def test_an_example_over_the_memory_limit_stops_the_run_without_a_verdict(
    sample_factory, shared_cache: Path, tmp_path: Path
) -> None:
    """--memory caps the example's container: running out is an infrastructure fault, named
    with the limit, never a verdict; a higher limit resumes the same session."""
    sample = sample_factory(PYPTO_REGRESSION)
    workdir = tmp_path / "work"
    args = run_args(sample, workdir, shared_cache, "--run-env", "SAMPLE_HOLD_MIB=768")

    stopped = cli(*args, "--memory", "256m", "--infra-retries", "3")

    assert stopped.returncode == 4, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    good = sample.pypto_shas[0][:12]
    assert f"the example run of {good} on device 0 ran out of memory under its 256m" in last, last
    assert "not a verdict" in last and "3 infrastructure failures in a row" in last, last
    assert json.loads((workdir / "ledger.json").read_text())["attempts"] == []
    faults = (workdir / "infrastructure.log").read_text().splitlines()
    assert len(faults) == 3 and all("ran out of memory" in line for line in faults), faults
    # Tries are spaced (1 s, then 2 s): a fault of a moment does not use them all up.
    times = [datetime.fromisoformat(line.split()[0]) for line in faults]
    assert (times[2] - times[1]).total_seconds() >= 2.0, faults

    resumed = cli(*args, "--memory", "2g", "--json")

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["pypto"]["first_bad"] == sample.pypto_shas[5]


@pytest.mark.parametrize(
    ("run_env", "limits", "said"),
    [
        ("SAMPLE_HOLD_AFTER_MIB=768", ["--memory", "256m"], "ran out of memory under its 256m"),
        (
            "SAMPLE_SAYS_FIRST=[ERROR] aclInit failed: error 507033 (device busy)",
            [],
            "hit a device or machine fault",
        ),
    ],
    ids=["killed-for-memory-after-it", "after-a-device-fault"],
)
def test_a_golden_mismatch_the_infrastructure_spoilt_is_no_verdict(
    sample_factory, shared_cache: Path, tmp_path: Path, run_env: str, limits: list[str], said: str
) -> None:
    """The known-bad commit prints its golden mismatch, then runs out of memory under --memory;
    or prints it after aclInit failed (a busy card), comparing garbage. Either was recorded as
    bad, and an infrastructure fault named the culprit with exit 0. A pass beside the same
    device line (the known-good end) computed right and stays a pass."""
    sample = sample_factory(PYPTO_REGRESSION)
    workdir = tmp_path / "work"
    args = run_args(sample, workdir, shared_cache, "--run-env", run_env)

    stopped = cli(*args, *limits, "--infra-retries", "2")

    assert stopped.returncode == 4, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert f"the example run of {sample.pypto_shas[-1][:12]} on device 0 {said}" in last, last
    attempts = json.loads((workdir / "ledger.json").read_text())["attempts"]
    assert [a["verdict"] for a in attempts] == ["good"]  # the known-good end, which passed


def test_a_build_that_hangs_stops_with_what_to_do_and_skip_takes_it_out(
    shared_cache: Path, tmp_path: Path
) -> None:
    """A timeout is never a verdict, so a build that always hangs stops every run (exit 4): the
    message says to raise --build-timeout or to --skip the commit, which then is untestable."""
    sample = make_sample(tmp_path / "sample", SampleSpec(**SMALL, bumps=()))  # all good
    pypto = sample.pypto
    (pypto / "setup.py").write_text("import time\n\ntime.sleep(600)\n")
    git(pypto, "add", "setup.py")
    git(pypto, "commit", "-q", "-m", "build: a setup.py that never returns")
    hangs = git(pypto, "rev-parse", "HEAD")
    (pypto / "setup.py").unlink()
    module = pypto / "pypto" / "__init__.py"
    module.write_text(module.read_text().replace("FACTOR = 1.0", "FACTOR = 1.001"))
    git(pypto, "commit", "-qam", "build: drop setup.py; scale the mean")
    workdir = tmp_path / "work"
    args = run_args(sample, workdir, shared_cache, "--build-timeout", "5", "--infra-retries", "1")
    args[args.index("--good") + 1] = sample.pypto_shas[-1]

    stopped = cli(*args, "--json")

    assert stopped.returncode == 4, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert f"the pypto build of {hangs[:12]} timed out after 5s" in last, last
    assert "raise --build-timeout" in last and f"--skip {hangs[:12]}" in last, last
    assert "it is retried" not in last

    skipped = cli(*args, "--skip", hangs[:10], "--json")

    assert skipped.returncode == 1, skipped.stderr
    assert skipped.json()["pypto"]["candidates"] == [hangs, git(pypto, "rev-parse", "HEAD")]
    ledger = json.loads((workdir / "ledger.json").read_text())
    [taken] = [a for a in ledger["attempts"] if a["pypto_sha"] == hangs]
    assert taken["verdict"] == "skip" and taken["reason"].startswith("skipped by --skip")
    assert not taken["builds"], "a skipped commit is never built"
    assert any(
        note.startswith("1 pypto candidate could not be tested: skipped by --skip")
        for note in skipped.json()["notes"]
    )

    # Without --skip the commit is tried again (and hangs again).
    again = cli(*args, "--json")

    assert again.returncode == 4, again.stderr
    superseded = json.loads((workdir / "ledger.json").read_text())["superseded"]
    assert taken["run_id"] in superseded


def test_an_example_that_hangs_inside_a_bump_names_the_simpler_commit_to_skip(
    sample_factory, shared_cache: Path, tmp_path: Path
) -> None:
    """A state inside a bump is simpler's commit with pypto pinned at the bump: the stop named
    the bump and advised `--skip` of it, which took every simpler state out with it (an answer
    already found became a range, exit 1)."""
    # simpler r1 -> r5 at pypto 4, r2 regressed; the simpler level tests r3 first.
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 5),), simpler_regression_at=2))
    hangs = sample.simpler_shas[3]
    workdir = tmp_path / "work"
    args = run_args(
        sample,
        workdir,
        shared_cache,
        *("--run-env", "SAMPLE_HANG_AT_SIMPLER=3", "--timeout", "10", "--infra-retries", "1"),
    )

    stopped = cli(*args)

    assert stopped.returncode == 4, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    pair = f"{sample.pypto_shas[4][:12]} with simpler {hangs[:12]}"
    assert f"nothing recorded for {pair}: the example run of {pair} on device 0 timed" in last
    assert last.endswith(f"run again with --skip {hangs[:12]} to take it as untestable"), last

    resumed = cli(*args, "--skip", hangs[:12], "--json")

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["simpler"]["culprit"] == sample.simpler_shas[2]


def test_ctrl_c_while_a_builder_image_is_made_ends_that_build_at_once(
    sample_factory, tmp_path, docker_client
):
    """The builder image's tool install is one long step on a real CANN image. Ctrl-C during
    it ended the run only when the step did (the thread reading the build waited for it): here
    the base image's entrypoint holds that step 300 s. The build is cancelled in the engine, its
    steps are removed, and the run exits 130 at once."""
    token = secrets.token_hex(4)
    slow = f"/usr/local/bin/slow-tools-{token}.sh"
    script = (
        "#!/bin/sh\n"
        'case "$*" in *"--ignore-installed"*) sleep 300;; esac\n'
        'exec /usr/local/bin/entrypoint.sh "$@"\n'
    )
    encoded = base64.b64encode(script.encode()).decode()
    maker = docker_client.containers.create(
        BASE_IMAGE, ["/bin/sh", "-c", f"echo {encoded} | base64 -d > {slow} && chmod 755 {slow}"]
    )
    try:
        maker.start()
        assert maker.wait(timeout=60)["StatusCode"] == 0
        base = maker.commit(
            repository="bisect-precision-test/slow-tools-base",
            tag=token,
            conf={"Entrypoint": [slow], "Labels": {"bisect-precision-test.slow-tools": "1"}},
        )
    finally:
        maker.remove(force=True)
    sample = sample_factory(PYPTO_REGRESSION)
    args = run_args(sample, tmp_path / "work", tmp_path / "cache", "--json")
    args[args.index("--base-image") + 1] = f"bisect-precision-test/slow-tools-base:{token}"
    process = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def installing() -> bool:
        return any(
            slow in " ".join(c.attrs["Config"].get("Cmd") or [])
            for c in docker_client.containers.list(ignore_removed=True)
        )

    try:
        deadline = time.monotonic() + 300
        while not installing() and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1]
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr
        deadline = time.monotonic() + 20
        while installing() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not installing()
        made_on_it = [
            image.id
            for image in docker_client.images.list(all=True)
            if image.attrs.get("Parent") == base.id
        ]
        assert made_on_it == [], "the cancelled build's steps stayed"
        logs = list((tmp_path / "cache" / "builders" / "logs").glob("*.log"))
        assert any("stopped: the run is stopping" in log.read_text() for log in logs), logs
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(base.id, force=True)
