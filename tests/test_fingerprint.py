"""Environment fingerprints: where a session's environment changed, and what the probe reads."""

from __future__ import annotations

import os
import threading
import time

import pytest

from runner import fingerprint
from runner.execute import KIND_LABEL, Cancelled
from runner.fingerprint import Collector, changes, describe, host_facts, parse_probe
from runner.ledger import Attempt
from tests.fixtures.attempts import recorded


def attempt(run_id: str, **fingerprint: str) -> Attempt:
    return recorded(run_id, fingerprint=fingerprint)


def test_a_change_is_placed_between_the_last_old_and_the_first_new_attempt():
    runs = [
        attempt("001", base_image_tag="sha256:1", driver="23.0", test_image_id="x"),
        attempt("002"),  # recorded before fingerprints existed: no evidence either way
        attempt("003", base_image_tag="sha256:1", driver="23.0", test_image_id="y"),
        attempt("004", base_image_tag="sha256:2", driver="23.0", test_image_id="z"),
        attempt("005", base_image_tag="sha256:2", driver="24.1", test_image_id="z"),
    ]

    found = changes(runs)

    assert [(c.key, c.before, c.after) for c in found] == [
        ("base_image_tag", "003", "004"),
        ("driver", "004", "005"),
    ]
    assert "the base image tag now names another image" in describe(found[0])
    assert "sha256:1 -> sha256:2" in describe(found[0])
    assert describe(found[0]).endswith("the runs on both sides used the same image")
    assert describe(found[1]).endswith("verdicts on either side may not be comparable")
    assert changes(runs[:3]) == []


def test_the_probe_output_gives_a_freeze_digest_and_the_cann_version():
    output = (
        "numpy==1.26.4\ntorch==2.3.0\n@@bisect-precision-cann@@\n"
        "# /usr/local/Ascend/ascend-toolkit/latest/version.cfg\n"
        "runtime_running_version=[8.0.RC2:8.0.RC2]\nVersion=8.0.RC2\n"
    )
    facts = parse_probe(output)
    assert facts["pip_packages"] == "2"
    assert facts["cann"] == "runtime_running_version=[8.0.RC2:8.0.RC2]; Version=8.0.RC2"
    other = parse_probe(output.replace("2.3.0", "2.4.0"))
    assert other["pip_freeze"] != facts["pip_freeze"]
    assert parse_probe("numpy==1.26.4\n@@bisect-precision-cann@@\n")["cann"] == "absent"


def test_npu_smi_is_asked_once_per_driver_version(tmp_path, monkeypatch):
    # A stand-in npu-smi (there is no NPU here) that counts its calls.
    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "npu-smi"
    smi.parent.mkdir()
    smi.write_text(
        f"#!/bin/sh\necho x >> {calls}\n"
        "echo '| npu-smi 24.1.rc2                 Version: 24.1.rc2 |'\necho '| 0  910B4 | OK |'\n"
    )
    smi.chmod(0o755)
    driver = tmp_path / "version.info"
    driver.write_text("Version=24.1.rc2\n")
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(fingerprint, "DRIVER_VERSION", driver)

    first = [host_facts() for _ in range(3)]
    assert calls.read_text().count("x") == 1
    assert first[0] == first[2]
    assert first[0]["driver"] == "Version=24.1.rc2"
    assert first[0]["npu_smi"] == "| npu-smi 24.1.rc2                 Version: 24.1.rc2 |"

    driver.write_text("Version=25.0.rc1\n")  # a driver upgrade mid-session is asked again
    upgraded = host_facts()
    assert calls.read_text().count("x") == 2
    assert upgraded["driver"] == "Version=25.0.rc1"


def test_a_failing_npu_smi_is_asked_again(tmp_path, monkeypatch):
    smi = tmp_path / "npu-smi"
    smi.write_bytes(b"\x7fnot a program")  # executable, but exec fails: OSError
    smi.chmod(0o755)
    stamp = smi.stat().st_mtime
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(fingerprint, "DRIVER_VERSION", tmp_path / "no-driver")
    assert host_facts()["npu_smi"] == "failed"
    smi.write_text("#!/bin/sh\necho 'Version: 24.1'\n")
    os.utime(smi, (stamp, stamp))  # the same binary as far as the cache key goes
    assert host_facts()["npu_smi"] == "Version: 24.1"


def _counting_probes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The thread that starts each probe container, and the container's kind label (the real
    one runs)."""
    threads: list[tuple[str, str]] = []
    real = fingerprint.run_container

    def counted(client, spec, **kwargs):  # type: ignore[no-untyped-def]
        threads.append((threading.current_thread().name, spec.labels.get(KIND_LABEL, "")))
        return real(client, spec, **kwargs)

    monkeypatch.setattr(fingerprint, "run_container", counted)
    return threads


@pytest.mark.docker
def test_the_base_image_is_probed_once_in_the_background_from_the_first_round(
    docker_client, base_image, monkeypatch
):
    threads = _counting_probes(monkeypatch)
    image = docker_client.images.get(base_image).id
    collector = Collector(docker_client, base_image, "0", pinned=image)

    collector.prepare()
    collector.prepare()
    seen = [collector(None, "0"), collector("sha256:test", "1")]
    collector.close()

    assert threads == [("fingerprint", "fingerprint")], (
        "one probe, started by prepare(), not by the attempt, and labelled as such"
    )
    assert seen[0]["pip_freeze"] == seen[1]["pip_freeze"]
    assert int(seen[0]["pip_packages"]) > 0
    assert seen[1]["test_image_id"] == "sha256:test"


@pytest.mark.docker
def test_closing_the_collector_stops_a_probe_still_running(docker_client, base_image, monkeypatch):
    monkeypatch.setattr(fingerprint, "PROBE", "sleep 60")
    image = docker_client.images.get(base_image).id
    collector = Collector(docker_client, base_image, "0", pinned=image)
    collector.prepare()
    time.sleep(1.0)  # the probe's container is up

    started = time.monotonic()
    collector.close()

    assert time.monotonic() - started < 20
    with pytest.raises(Cancelled):
        collector(None, "0")
