"""Builds ahead of need: the guesses start in the order the session gives, a new round's list
replaces the guesses of the last one that have not started, and a guess already building that
neither the new list nor the round now testing names is cancelled. Real git, Docker and wheel
builds."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import docker
import pytest

from runner.attempts import DockerTester, RunSettings, _stopping
from runner.devices import Passthrough
from runner.errors import BadInput, BuildTimedOut, ExampleStopped
from runner.execute import LABEL
from runner.executor import LocalExecutor, Slot
from runner.history import History
from runner.ledger import Ledger
from runner.sample.histories import SampleSpec, git
from runner.search import Verdict
from runner.session import Request
from runner.sources import SourceExporter
from runner.wheels import BuildSettings, WheelCache
from tests.fixtures.samples import SMALL
from tests.test_executor import a_test_image_being_made
from tests.test_ledger import make_inputs

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


@dataclass
class Guessing:
    tester: DockerTester
    executor: LocalExecutor
    cache: WheelCache
    pairs: list[tuple[str, str | None]]


@pytest.fixture
def guessing(
    docker_client: docker.DockerClient,
    base_image: str,
    setuptools_builder: str,
    sample_factory,
    tmp_path: Path,
) -> Iterator[Guessing]:
    """One build slot; four consecutive pypto commits of a small sample (two simpler pins)."""
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4), (6, 5)), pypto_regression_at=5))
    links = History(sample.pypto).gitlinks(sample.pypto_shas)
    pairs = [(sha, links[sha]) for sha in sample.pypto_shas[4:8]]
    cache = WheelCache(tmp_path / "cache" / "wheels")
    executor = LocalExecutor(docker_client, cache, [Slot("0")], build_jobs=1)
    ledger = Ledger.open(tmp_path / "work" / "ledger.json", make_inputs(tmp_path), tool_version="t")
    tester = DockerTester(
        executor,
        ledger,
        SourceExporter(sample.pypto, tmp_path / "cache"),
        cache,
        BuildSettings(base_image=base_image, base_image_id=setuptools_builder, timeout=300),
        RunSettings(
            lib_dir=sample.lib,
            script="x.py",
            platform="a2a3sim",
            device="0",
            passthrough=Passthrough(),
        ),
        workdir=tmp_path / "work",
        ccache_dir=tmp_path / "cache" / "ccache",
    )
    try:
        yield Guessing(tester, executor, cache, pairs)
    finally:
        tester.close(cancel=False)
        ledger.close()
        # Test images are keyed by content, so another test's run on the engine may remove one
        # meanwhile (ids alone, tolerating NotFound) or be running its example in one (409): the
        # suite's own clean-up removes that one at the end.
        for sha, _ in pairs:
            for image_id in docker_client.api.images(
                filters={"label": f"{LABEL}.pypto={sha}"}, quiet=True
            ):
                try:
                    docker_client.images.remove(image_id, force=True)
                except docker.errors.NotFound:
                    continue
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:
                        raise
                    warnings.warn(f"left to the suite's clean-up: {exc.explanation}", stacklevel=1)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def settled(tester: DockerTester, executor: LocalExecutor) -> bool:
    return not (
        tester._wanted
        or executor.busy_builds()
        or any(t.name == "prefetch-image" for t in threading.enumerate())
    )


def pypto_builds(cache: WheelCache) -> list[str]:
    built = sorted((e.created, e.commit) for e in cache.entries() if e.package == "pypto")
    return [commit for _, commit in built]


def test_guesses_start_in_order_and_a_new_list_replaces_those_not_started(
    guessing: Guessing,
) -> None:
    tester, executor, pairs = guessing.tester, guessing.executor, guessing.pairs
    told: list[int] = []  # what the progress line hears of the pairs being built ahead
    tester.ahead = told.append
    tester.prefetch(pairs[:3])
    # The first guess takes the one build slot; the next round's list comes meanwhile, and that
    # round tests the first guess: it goes on.
    wait_for(lambda: executor.busy_builds() > 0, 60, "no guess started")
    assert tester.prefetch(pairs[3:], testing=[pairs[0]]) == 1
    wait_for(
        lambda: tester.cached(*pairs[0]) and tester.cached(*pairs[3]) and settled(tester, executor),
        300,
        "the guesses never finished",
    )

    assert pypto_builds(guessing.cache) == [pairs[0][0], pairs[3][0]]
    assert not tester.cached(*pairs[1]) and not tester.cached(*pairs[2])
    assert told and told[0] == 1 and told[-1] == 0 and max(told) <= 2, told


def test_a_guess_building_that_no_longer_may_be_tested_is_cancelled(guessing: Guessing) -> None:
    tester, executor, pairs = guessing.tester, guessing.executor, guessing.pairs
    # The two pairs pin different simpler commits: every wheel of the first is stale.
    assert pairs[0][1] != pairs[3][1]
    tester.prefetch(pairs[:1])
    wait_for(lambda: executor.busy_builds() > 0, 60, "no guess started")
    tester.prefetch(pairs[3:])
    wait_for(
        lambda: tester.cached(*pairs[3]) and settled(tester, executor),
        300,
        "the new guess never finished",
    )

    built = {(e.package, e.commit) for e in guessing.cache.entries()}
    assert ("pypto", pairs[0][0]) not in built and ("simpler", pairs[0][1]) not in built
    assert pypto_builds(guessing.cache) == [pairs[3][0]]
    assert not list(guessing.cache.tmp_dir.iterdir()), "a cancelled build left its directory"


def test_a_likelier_guess_takes_the_build_slot_of_one_further_down_the_list(
    guessing: Guessing,
) -> None:
    tester, executor, pairs = guessing.tester, guessing.executor, guessing.pairs
    assert pairs[0][1] != pairs[3][1]  # no wheel in common
    tester.prefetch(pairs[:1])
    wait_for(
        lambda: any(seconds is not None for seconds in executor.guesses().values()),
        60,
        "no guess started",
    )
    # A round's outcome puts another pair first: the guess under way gives up the one slot,
    # and is built again in its turn.
    assert tester.prefetch([pairs[3], pairs[0]]) == 2
    wait_for(
        lambda: tester.cached(*pairs[0]) and tester.cached(*pairs[3]) and settled(tester, executor),
        300,
        "the guesses never finished",
    )

    assert pypto_builds(guessing.cache) == [pairs[3][0], pairs[0][0]]
    assert not list(guessing.cache.tmp_dir.iterdir()), "a stopped build left its directory"


def test_a_guess_waits_for_a_tests_image_until_an_example_has_shown_it_hides_guesses(
    guessing: Guessing,
) -> None:
    tester, executor = guessing.tester, guessing.executor
    executor.guesses_compete = True  # one device, one build slot: guesses compete with tests
    with a_test_image_being_made(executor), tester._ahead_cond:
        assert not tester._guess_may_start()  # no example has run yet
        tester._run_times.append(5.0)  # a slow example, builds of a second
        tester._build_times.append(1.0)
        assert tester._guess_may_start()
        tester._run_times[:] = [0.05]  # a fast one: guesses would only slow the rounds
        assert not tester._guess_may_start()


def test_a_state_inside_a_bump_whose_tools_nothing_supplies_names_the_skip_that_goes_on() -> None:
    """The plan resolves the tools of the range's commits and their pins before the first step
    and offers --skip for one between the ends; a simpler state inside a bump is resolved when
    its test comes, and offers the same (an end's, or the commit's own unreadable build, not)."""
    pypto, inside, end = "a" * 40, "b" * 40, "e" * 40

    class Tools:
        def builder(self, package: str, commit: str, at: str | None, show: bool = True) -> None:
            if package == "simpler":
                raise BadInput(f"simpler {commit[:12]}: no release of setuptools satisfies it")

    class Turns:
        @contextlib.contextmanager
        def turn(self, speculative: bool) -> Iterator[None]:
            yield

    tester = SimpleNamespace(toolchains=Tools(), _git=Turns(), _ends={end})
    for simpler, advice in (
        (inside, f"; or, if it cannot be built, --skip {inside[:12]}"),
        (end, ""),
    ):
        with pytest.raises(BadInput) as caught:
            DockerTester._builders(tester, pypto, simpler)  # type: ignore[arg-type]
        said = str(caught.value)
        assert said.startswith(f"simpler {simpler[:12]}: no release of setuptools"), said
        assert ("--skip" in said) == bool(advice) and advice in said, said


@pytest.mark.parametrize("at_an_end", [False, True])
def test_a_stop_after_timeouts_says_what_lets_the_run_go_on(at_an_end: bool) -> None:
    """--skip of an end of the range is refused, so the advice for an end is to move it."""
    pypto, simpler = "a" * 40, "b" * 40
    ends = {pypto, simpler} if at_an_end else {"c" * 40}
    build = BuildTimedOut("the pypto build timed out", "pypto", pypto, 30.0, "/log")
    run = ExampleStopped(f"the example run of {pypto[:12]} on device 0 timed out", True)
    killed = ExampleStopped(f"the example run of {pypto[:12]} on device 0 was killed", False)

    for failures, raise_ in (
        ([build, build], "raise --build-timeout if "),
        ([run], "raise --timeout if "),
        ([killed], "give the example more memory (--memory"),
    ):
        said = _stopping(failures, (pypto, pypto[:12]), ends)
        assert raise_ in said, said
        if at_an_end:
            assert said.endswith("move --good or --bad off it (it is an end of the range)"), said
        else:
            assert said.endswith(f"--skip {pypto[:12]} to take it as untestable"), said


def test_pypto_is_built_with_the_tested_runtime_only_where_its_build_reads_one(
    sample_factory, tmp_path: Path
) -> None:
    """The pypto wheel of a pair bakes the pair's simpler when pypto's build reads the runtime
    and pins another commit there; its own pin, a build that reads none, or a commit without
    the runtime submodule (nothing there to move) keep the plain wheel."""
    sample = sample_factory(
        SampleSpec(**SMALL, bumps=((4, 5),), simpler_regression_at=3, regression_in_header=True)
    )
    checkout = tmp_path / "pypto"
    git(tmp_path, "clone", "-q", str(sample.pypto), str(checkout))
    git(checkout, "checkout", "-q", "-b", "early", sample.pypto_shas[1])  # before the runtime
    (checkout / "CMakeLists.txt").write_text("add_subdirectory(runtime)\n")
    git(checkout, "add", "CMakeLists.txt")
    git(checkout, "commit", "-q", "-m", "build: name the runtime before it exists")
    early = git(checkout, "rev-parse", "HEAD")
    tester = SimpleNamespace(
        _reads={}, exporter=SourceExporter(checkout, tmp_path / "cache"), path="runtime"
    )

    def inputs(pypto: str, simpler: str | None) -> dict[str, str]:
        return DockerTester._inputs(tester, pypto, simpler)  # type: ignore[arg-type]

    bump, other = sample.pypto_shas[4], sample.simpler_shas[2]
    assert inputs(bump, other) == {"runtime": other}
    assert inputs(bump, sample.gitlink(4)) == {}
    assert inputs(bump, None) == {}
    assert inputs(sample.pypto_shas[1], other) == {}  # its build reads no runtime
    assert inputs(early, other) == {}  # it names the runtime, but has no submodule there

    # A build that reads the runtime where its build files do not show it: the session says so
    # once the pointer alone changed the pypto wheel.
    plain = sample_factory(SampleSpec(**SMALL, bumps=((4, 5),)))
    tester = SimpleNamespace(
        _reads={}, exporter=SourceExporter(plain.pypto, tmp_path / "cache2"), path="runtime"
    )
    bump, other = plain.pypto_shas[4], plain.simpler_shas[2]
    assert inputs(bump, other) == {}
    DockerTester.reads_runtime(tester, bump)  # type: ignore[arg-type]
    assert inputs(bump, other) == {"runtime": other}
    assert inputs(bump, plain.gitlink(4)) == {}


def test_the_progress_phase_names_the_builds_a_test_waits_for(guessing: Guessing) -> None:
    """Both wheels while both are to build, then the one left once the other is done; only
    pypto's when simpler's is built already (the phase used to name the last job submitted, a
    cached pypto while simpler built, and then kept naming both until both were done)."""
    tester, pairs = guessing.tester, guessing.pairs
    phases: list[str] = []
    tester._show_phase = phases.append
    (first, pin), (second, same) = pairs[0], pairs[1]
    assert pin == same  # two pypto commits of one bump

    with pytest.raises(BadInput, match=r"x\.py"):  # the fixture's example: only builds matter
        tester.test("pypto", first, pin)
    both = f"build simpler {pin[:12]} and pypto {first[:12]}"
    # One build slot: simpler's wheel is built first, then pypto's alone.
    assert phases[phases.index(both) :] == [both, f"build pypto {first[:12]}", "run"], phases
    phases.clear()
    with pytest.raises(BadInput, match=r"x\.py"):
        tester.test("pypto", second, same)
    builds = [p for p in phases if p.startswith("build ")]
    assert builds == [f"build pypto {second[:12]}"], phases


def test_requests_added_while_a_round_runs_are_tested_recorded_and_numbered(
    guessing: Guessing,
) -> None:
    """`test_round(..., more=...)`: the session adds tests as others end (a device starting the
    next round early). Each added one runs and goes into the ledger with the round it opens or
    joins, and the call returns every attempt in the order asked."""
    tester, pairs = guessing.tester, guessing.pairs
    tester.run = replace(tester.run, script="models/sample/decode_fwd.py")
    calls: list[tuple[int, list[int]]] = []
    plan = [
        ([Request("pypto", *pairs[1])], False),  # opens the next round
        ([Request("pypto", *pairs[2])], True),  # joins it
        ([], False),
        ([], False),
    ]

    def more(attempt, index: int, pending: list[int]):
        calls.append((index, pending))
        return plan[len(calls) - 1]

    attempts = tester.test_round([Request("pypto", *pairs[0])], more=more)

    assert [(a.pypto_sha, a.simpler_sha) for a in attempts] == pairs[:3]
    assert calls[0] == (0, []) and sorted(i for i, _ in calls) == [0, 1, 2]
    first, opened, joined = (a.round for a in attempts)
    assert opened == joined == first + 1
    recorded = {a.run_id: a.round for a in guessing.tester.ledger.document.attempts}
    assert [recorded[a.run_id] for a in attempts] == [first, opened, joined]
    assert all(a.verdict in (Verdict.GOOD, Verdict.BAD) for a in attempts)
