"""Several devices per round, speculative builds and kills during concurrent work, through the
real CLI, the real Docker Engine and generated histories."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from runner.execute import LABEL, OWNER_LABEL
from runner.sample.demo import on_simulator
from runner.sample.histories import SampleSpec
from tests.fixtures.cli import built, cli, rebuilt, run_args
from tests.fixtures.samples import SMALL

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.timeout(900)]

TWO_LEVEL = SampleSpec(
    **{**SMALL, "pypto_commits": 12}, bumps=((4, 2), (7, 5), (10, 6)), simpler_regression_at=4
)


def _attempts(workdir: Path) -> list[dict]:
    path = workdir / "ledger.json"
    if not path.exists():
        return []
    try:
        return json.loads(path.read_text())["attempts"]
    except (json.JSONDecodeError, KeyError):
        return []


def test_two_simulator_lanes_test_two_commits_per_round_to_the_same_culprits(
    sample_factory, shared_cache, tmp_path
):
    sample = sample_factory(TWO_LEVEL)
    one = cli(*on_simulator(run_args(sample, tmp_path / "one", shared_cache), "0"), "--json")
    two = cli(*on_simulator(run_args(sample, tmp_path / "two", shared_cache), "0,1"), "--json")

    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    for result in (one, two):
        report = result.json()
        assert report["pypto"]["first_bad"] == sample.pypto_shas[7]
        assert report["simpler"]["culprit"] == sample.simpler_shas[4]
    attempts = _attempts(tmp_path / "two")
    assert {a["device"] for a in attempts if a["device"]} == {"0", "1"}
    rounds: dict[int, list[dict]] = {}
    for attempt in attempts:
        rounds.setdefault(attempt["round"], []).append(attempt)
    assert any(len(members) == 2 for members in rounds.values())
    assert len(rounds) < len(attempts)
    assert len(rounds) < len({a["round"] for a in _attempts(tmp_path / "one")})


def test_a_device_that_fails_is_taken_out_of_the_pool_and_never_gives_a_verdict(
    sample_factory, shared_cache, tmp_path
):
    """Card 1 has no /dev/davinci1 in its containers (only davinci0 is mapped): aclInit fails
    there, so the card leaves the pool and card 0 finishes the bisect alone."""
    sample = sample_factory(TWO_LEVEL)
    args = run_args(sample, tmp_path / "work", shared_cache)
    args[args.index("--device") + 1] = "0,1"

    result = cli(*args)

    assert result.returncode == 0, result.stderr
    assert "device 1 taken out of the pool" in result.stderr
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert report["simpler"]["culprit"] == sample.simpler_shas[4]
    attempts = _attempts(tmp_path / "work")
    assert attempts and {a["device"] for a in attempts if a["device"]} == {"0"}
    assert "on device 1" in (tmp_path / "work" / "infrastructure.log").read_text()
    notes = report["notes"]
    assert any(note.startswith("device 1 was taken out of the pool: ") for note in notes), notes
    assert any("retried and never counted as verdicts" in note for note in notes), notes


def test_an_example_that_times_out_on_every_card_keeps_the_cards_and_names_the_commit(
    sample_factory, shared_cache, tmp_path
):
    """A timeout is the commit's run, not the card: the same commit hangs on each card, so no
    card leaves the pool, and the stop says to raise --timeout or to --skip the commit."""
    sample = sample_factory(TWO_LEVEL)
    args = on_simulator(run_args(sample, tmp_path / "work", shared_cache), "0,1")

    result = cli(
        *args, "--timeout", "2", "--run-env", "SAMPLE_RUN_SECONDS=60", "--infra-retries", "2"
    )

    assert result.returncode == 4, result.stderr
    assert "taken out of the pool" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "timed out" in last and "raise --timeout if the example is only slow here" in last
    log = (tmp_path / "work" / "infrastructure.log").read_text()
    assert "on device 0" in log and "on device 1" in log, "both cards kept running tests"


def test_a_kill_during_concurrent_builds_loses_nothing_and_the_resume_rebuilds_nothing(
    sample_factory, tmp_path, docker_client: docker.DockerClient
):
    sample = sample_factory(TWO_LEVEL)
    workdir, cache = tmp_path / "work", tmp_path / "cold-cache"
    args = on_simulator(run_args(sample, workdir, cache), "0,1")
    process = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", *args, "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    owner = f"{socket.gethostname()}:{process.pid}"
    deadline = time.monotonic() + 600

    def builds_running() -> int:
        return sum(
            1
            for c in docker_client.containers.list(
                filters={"label": [f"{LABEL}=1", f"{LABEL}.kind=wheel-build"]},
                ignore_removed=True,
            )
            if c.labels.get(OWNER_LABEL) == owner
        )

    # Kill once a round is recorded and at least one build (needed or speculative) is running.
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be killed"
        if len(_attempts(workdir)) >= 2 and builds_running():
            break
        time.sleep(0.1)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    recorded = _attempts(workdir)
    entries = list((cache / "wheels").glob("??/*"))
    assert all((entry / "entry.json").is_file() for entry in entries), "a half-written entry"

    result = cli(*args, "--json")

    assert result.returncode == 0, result.stderr
    assert result.json()["simpler"]["culprit"] == sample.simpler_shas[4]
    after = _attempts(workdir)
    assert after[: len(recorded)] == recorded
    assert rebuilt(recorded, after[len(recorded) :]) == []
    leftovers = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL}=1"}, ignore_removed=True
    )
    assert [c.name for c in leftovers if c.labels.get(OWNER_LABEL) == owner] == []
    # Every wheel built once: no (package, commit) was built twice across kill and resume.
    assert len(built(after)) == len(set(built(after)))
