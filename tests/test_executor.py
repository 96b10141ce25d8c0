"""The local executor: build slots with priorities, one build per cache key, cancellation, and a
pool of device slots; all with real containers on the real Docker Engine."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest

from runner.devices import Passthrough
from runner.errors import InfrastructureError
from runner.execute import LABEL, OWNER_LABEL, Cancelled
from runner.executor import (
    BuildJob,
    DeviceFault,
    LocalExecutor,
    SharedBuild,
    Slot,
    build_parallelism,
    default_build_jobs,
)
from runner.sample.packages import write_lib, write_pypto
from runner.wheels import BuildSettings, WheelCache, WheelResult
from tests.fixtures.attempts import example_job
from tests.test_wheels import Sources, assert_no_leftover_build_dirs, pypto_source

pytestmark = pytest.mark.docker


def sleeper(seconds: float, started: list[str], name: str) -> Sources:
    """A package whose build takes `seconds` (its setup.py sleeps) and says when it starts."""

    def write(dest: Path) -> None:
        started.append(name)
        write_pypto(dest, revision=1)
        setup = dest / "setup.py"
        body = setup.read_text() if setup.exists() else "from setuptools import setup\nsetup()\n"
        setup.write_text(f"import time\ntime.sleep({seconds})\n" + body)

    return Sources(write)


@pytest.fixture
def settings(base_image: str, setuptools_builder: str) -> BuildSettings:
    return BuildSettings(base_image=base_image, base_image_id=setuptools_builder, timeout=300)


def job(package: str, commit: str, source, settings, tmp_path: Path, **kw) -> BuildJob:
    return BuildJob(
        package=package,
        commit=commit,
        prepare=source,
        settings=settings,
        builder=None,
        ccache_dir=tmp_path / "ccache",
        **kw,
    )


def sleeping(
    letter: str,
    seconds: float,
    started: list[str],
    settings,
    tmp_path: Path,
    *,
    name: str | None = None,
    speculative: bool = False,
) -> BuildJob:
    """A pypto build of commit `letter` * 40 that takes `seconds` and appends `name` (default:
    the letter) to `started` when it starts."""
    source = sleeper(seconds, started, name or letter)
    return job("pypto", letter * 40, source, settings, tmp_path, speculative=speculative)


@contextmanager
def a_test_image_being_made(executor: LocalExecutor) -> Iterator[None]:
    """The executor counts a test's image under way, as `run` does while it layers one."""
    with executor._lock:
        executor._imaging += 1
    try:
        yield
    finally:
        with executor._lock:
            executor._imaging -= 1


def build_containers(client: docker.DockerClient, commit: str) -> list:
    return client.containers.list(
        all=True,
        filters={"label": [f"{LABEL}=1", f"{LABEL}.kind=wheel-build", f"{LABEL}.commit={commit}"]},
        ignore_removed=True,
    )


def test_default_build_jobs_follow_cores_and_memory():
    assert default_build_jobs(cores=2, memory_gib=24) == 2
    assert default_build_jobs(cores=2, memory_gib=4) == 1  # one build's peak is all there is
    assert default_build_jobs(cores=192, memory_gib=1536) == 24
    assert build_parallelism(2, cores=2) == 2
    assert build_parallelism(24, cores=192) == 8


def _wheel(tmp_path: Path) -> WheelResult:
    wheel = tmp_path / "pypto-0.1-py3-none-any.whl"
    return WheelResult(
        package="pypto", commit="e" * 40, key="k", ok=True, wheel=wheel, sha256="0" * 64,
        log_path=tmp_path / "build.log", seconds=2.5, from_cache=False, reason="",
    )  # fmt: skip


def test_a_shared_build_belongs_to_the_first_test_that_waits_for_it(tmp_path):
    build: Future[WheelResult] = Future()
    shared = SharedBuild(build)
    guess = shared.attach(speculative=True)
    test = shared.attach(speculative=False)
    other_test = shared.attach(speculative=False)
    assert not any(f.done() for f in (guess, test, other_test))
    result = _wheel(tmp_path)
    build.set_result(result)
    assert test.result() == result  # built, by the first test that needed it
    assert guess.result().from_cache and other_test.result().from_cache
    assert guess.result().wheel == result.wheel
    assert shared.attach(speculative=False).result().from_cache  # too late to own it


def test_a_guess_alone_owns_its_build_and_a_failure_reaches_every_caller(tmp_path):
    build: Future[WheelResult] = Future()
    shared = SharedBuild(build)
    first, second = shared.attach(speculative=True), shared.attach(speculative=True)
    build.set_result(_wheel(tmp_path))
    assert not first.result().from_cache and second.result().from_cache

    failing: Future[WheelResult] = Future()
    broken = SharedBuild(failing)
    waiters = [broken.attach(speculative=s) for s in (True, False)]
    failing.set_exception(Cancelled("the session is stopping"))
    for waiter in waiters:
        with pytest.raises(Cancelled):
            waiter.result()


def test_guesses_yield_where_a_rounds_own_builds_can_fill_every_build_slot(docker_client, tmp_path):
    cache = WheelCache(tmp_path / "wheels")
    cases = [(2, ["0"], True), (2, ["0", "1"], True), (8, ["0"], False), (8, list("0123"), True)]
    for jobs, devices, competing in cases:
        slots = [Slot(device) for device in devices]
        with LocalExecutor(docker_client, cache, slots, build_jobs=jobs) as executor:
            assert executor.guesses_compete is competing, (jobs, devices)


def test_one_build_per_cache_key_and_needed_builds_overtake_speculative_ones(
    docker_client, settings, tmp_path
):
    cache = WheelCache(tmp_path / "wheels")
    started: list[str] = []
    with LocalExecutor(docker_client, cache, [Slot("0")], build_jobs=1) as executor:
        first = executor.build(sleeping("a", 3, started, settings, tmp_path, speculative=True))
        time.sleep(1.0)  # "a" holds the only build slot now
        ahead = executor.build(sleeping("b", 0, started, settings, tmp_path, speculative=True))
        needed = executor.build(sleeping("c", 0, started, settings, tmp_path))
        twice = executor.build(sleeping("c", 0, started, settings, tmp_path, name="c2"))
        results = [f.result(timeout=600) for f in (first, ahead, needed, twice)]

    assert all(r.ok for r in results)
    # One build for "c": the first test to ask owns it, the second sees the cache.
    assert [r.from_cache for r in results] == [False, False, False, True]
    assert started == ["a", "c", "b"]  # the needed build went before the queued speculative one
    assert_no_leftover_build_dirs(cache)


def test_a_needed_build_joins_a_speculative_one_already_running(docker_client, settings, tmp_path):
    cache = WheelCache(tmp_path / "wheels")
    started: list[str] = []
    with LocalExecutor(docker_client, cache, [Slot("0")], build_jobs=2) as executor:
        ahead = executor.build(sleeping("d", 2, started, settings, tmp_path, speculative=True))
        time.sleep(0.5)
        needed = executor.build(sleeping("d", 0, started, settings, tmp_path, name="d2"))
        built, guessed = needed.result(timeout=600), ahead.result(timeout=600)
    assert started == ["d"]
    # The test that joined the guess owns the build; the guess was not a build ahead after all.
    assert built.ok and not built.from_cache
    assert guessed.from_cache and guessed.wheel == built.wheel


def test_a_guess_starts_while_a_tests_image_is_made_but_not_beside_its_builds(
    docker_client, settings, tmp_path
):
    cache = WheelCache(tmp_path / "wheels")
    started: list[str] = []
    with LocalExecutor(docker_client, cache, [Slot("0")], build_jobs=2) as executor:
        needed = executor.build(sleeping("f", 2, started, settings, tmp_path))
        time.sleep(0.5)
        guess = executor.build(sleeping("e", 0, started, settings, tmp_path, speculative=True))
        assert needed.result(timeout=600).ok and guess.result(timeout=600).ok
        assert started == ["f", "e"]  # the guess waited for the test's build
        with a_test_image_being_made(executor):
            assert executor.needed_busy() and not executor.needed_busy(images=False)
            later = executor.build(sleeping("g", 0, started, settings, tmp_path, speculative=True))
            assert later.result(timeout=120).ok
    assert started == ["f", "e", "g"]


def test_closing_stops_speculative_builds_and_caches_nothing_half_written(
    docker_client, settings, tmp_path
):
    cache = WheelCache(tmp_path / "wheels")
    started: list[str] = []
    executor = LocalExecutor(docker_client, cache, [Slot("0")], build_jobs=1)
    running = executor.build(sleeping("e", 600, started, settings, tmp_path, speculative=True))
    queued = executor.build(sleeping("f", 0, started, settings, tmp_path, speculative=True))
    deadline = time.monotonic() + 120
    while not build_containers(docker_client, "e" * 40) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert build_containers(docker_client, "e" * 40), "the speculative build never started"

    began = time.monotonic()
    executor.close(cancel=False)  # the session ended: nobody needs them any more

    assert time.monotonic() - began < 30
    for future in (running, queued):
        with pytest.raises(Cancelled):
            future.result(timeout=5)
    assert started == ["e"]
    assert cache.entries() == []
    assert_no_leftover_build_dirs(cache)
    assert build_containers(docker_client, "e" * 40) == []


def test_a_retired_device_leaves_the_pool_but_the_last_one_stays(docker_client, tmp_path):
    cache = WheelCache(tmp_path / "wheels")
    zero, one = Slot("0"), Slot("1")
    notes: list[str] = []
    with LocalExecutor(docker_client, cache, [zero, one], echo=notes.append) as executor:
        executor.retire(one, "aclInit failed")
        assert list(executor.slots) == [zero]
        executor.retire(zero, "aclInit failed")
        assert list(executor.slots) == [zero]
    assert notes == ["device 1 taken out of the pool: aclInit failed"]


def test_runs_share_the_device_slots_one_run_per_slot(
    docker_client, base_image, settings, tmp_path
):
    """Three runs on two slots: each slot used, each run told which device it got."""
    cache = WheelCache(tmp_path / "wheels")
    lib = tmp_path / "lib"
    write_lib(lib)
    with LocalExecutor(docker_client, cache, [Slot("0"), Slot("1")], build_jobs=1) as executor:
        wheel = executor.build(job("pypto", "1" * 40, pypto_source(1), settings, tmp_path)).result(
            timeout=600
        )
        assert wheel.ok
        runs = [
            executor.run(
                example_job(wheel, base_image, settings.base_image_id, lib, tmp_path / f"run{i}")
            )
            for i in range(3)
        ]
        reports = [r.result(timeout=600) for r in runs]
    assert {r.slot.device for r in reports} == {"0", "1"}
    for report in reports:
        assert report.result is not None and report.result.exit_code is not None


@pytest.mark.parametrize("node", ["own", "shared"])
def test_a_card_whose_device_node_is_gone_is_a_device_fault_of_that_card(
    docker_client, base_image, settings, tmp_path, node
):
    """The engine cannot create a container with a device node that left the host: that card's
    fault (it leaves the pool), not an engine error that stops the run. A node every card's
    containers get (a control node, a --device-map of another card) is no card's: card 1 was
    taken out for card 2's mapped node, and the message named card 1."""
    cache = WheelCache(tmp_path / "wheels")
    lib = tmp_path / "lib"
    write_lib(lib)
    devices = (f"{tmp_path}/davinci1:/dev/davinci1:rwm",)
    if node == "shared":
        devices = ("/dev/null:/dev/davinci1:rwm", f"{tmp_path}/davinci2:/dev/davinci2:rwm")
    gone = Slot("1", Passthrough(devices=devices))
    with LocalExecutor(docker_client, cache, [gone], build_jobs=1) as executor:
        wheel = executor.build(job("pypto", "1" * 40, pypto_source(1), settings, tmp_path)).result(
            timeout=600
        )
        run = executor.run(
            example_job(wheel, base_image, settings.base_image_id, lib, tmp_path / "run", "a2a3")
        )
        with pytest.raises(InfrastructureError) as raised:
            run.result(timeout=600)
    mine = f"{OWNER_LABEL}={socket.gethostname()}:{os.getpid()}"
    assert not docker_client.containers.list(all=True, filters={"label": mine})
    if node == "shared":
        assert not isinstance(raised.value, DeviceFault)
        assert str(raised.value).startswith(
            f"device node {tmp_path}/davinci2, which every device's containers get, is not on "
            "the host: the Docker Engine failed running a container"
        ), raised.value
        return
    assert isinstance(raised.value, DeviceFault) and raised.value.slot is gone
    assert str(raised.value).startswith("device 1: the Docker Engine failed running a container")
    assert pickle.loads(pickle.dumps(raised.value)).slot.device == "1", "a Ray task raises it"


def test_a_run_waiting_for_a_device_stops_when_the_session_is_cancelled(docker_client, tmp_path):
    cache = WheelCache(tmp_path / "wheels")
    executor = LocalExecutor(docker_client, cache, [Slot("0")], build_jobs=1)
    pool = executor._pool
    slot = pool.take(threading.Event())  # the only device is busy
    stop = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.take(stop)
        except Cancelled as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    executor.close(cancel=True)
    waiter.join(timeout=10)
    pool.give_back(slot)
    assert not waiter.is_alive() and len(errors) == 1
