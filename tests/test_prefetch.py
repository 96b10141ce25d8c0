"""Builds ahead of need: the guesses start in the order the session gives, and a new round's list
replaces the guesses of the last one that have not started. Real git, Docker and wheel builds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import docker
import pytest

from runner.attempts import DockerTester, RunSettings
from runner.devices import Passthrough
from runner.execute import LABEL
from runner.executor import LocalExecutor, Slot
from runner.history import History
from runner.ledger import Ledger
from runner.sample.histories import SampleSpec
from runner.sources import SourceExporter
from runner.wheels import BuildSettings, WheelCache
from tests.fixtures.samples import SMALL
from tests.test_ledger import make_inputs

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


def test_guesses_start_in_order_and_a_new_list_replaces_those_not_started(
    docker_client: docker.DockerClient,
    base_image: str,
    setuptools_builder: str,
    sample_factory,
    tmp_path: Path,
) -> None:
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
        tester.prefetch(pairs[:3])
        # The first guess takes the one build slot; the next round's list comes meanwhile.
        deadline = time.monotonic() + 60
        while executor.busy_builds() == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert tester.prefetch(pairs[3:]) == 1
        deadline = time.monotonic() + 300
        while (
            not (tester.cached(*pairs[0]) and tester.cached(*pairs[3]))
            or tester._wanted
            or executor.busy_builds()
            or any(t.name == "prefetch-image" for t in threading.enumerate())
        ):
            assert time.monotonic() < deadline, "the guesses never finished"
            time.sleep(0.1)
    finally:
        tester.close(cancel=False)
        ledger.close()
        for sha, _ in pairs:
            for image in docker_client.images.list(filters={"label": f"{LABEL}.pypto={sha}"}):
                docker_client.images.remove(image.id, force=True)

    built = sorted(
        (entry.created, entry.commit) for entry in cache.entries() if entry.package == "pypto"
    )
    assert [commit for _, commit in built] == [pairs[0][0], pairs[3][0]]
    assert tester.cached(*pairs[0]) and tester.cached(*pairs[3])
    assert not tester.cached(*pairs[1]) and not tester.cached(*pairs[2])
