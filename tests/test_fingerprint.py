"""Environment fingerprints: where a session's environment changed, and what the probe reads."""

from __future__ import annotations

from datetime import datetime, timezone

from runner.fingerprint import changes, describe, parse_probe
from runner.ledger import Attempt
from runner.search import Verdict


def attempt(run_id: str, **fingerprint: str) -> Attempt:
    now = datetime.now(timezone.utc)
    return Attempt(
        run_id=run_id,
        level="pypto",
        pypto_sha="a" * 40,
        simpler_sha=None,
        verdict=Verdict.GOOD,
        fingerprint=fingerprint,
        started_at=now,
        finished_at=now,
    )


def test_a_change_is_placed_between_the_last_old_and_the_first_new_attempt():
    runs = [
        attempt("001", base_image_id="sha256:1", driver="23.0", test_image_id="x"),
        attempt("002"),  # recorded before fingerprints existed: no evidence either way
        attempt("003", base_image_id="sha256:1", driver="23.0", test_image_id="y"),
        attempt("004", base_image_id="sha256:2", driver="23.0", test_image_id="z"),
        attempt("005", base_image_id="sha256:2", driver="24.1", test_image_id="z"),
    ]

    found = changes(runs)

    assert [(c.key, c.before, c.after) for c in found] == [
        ("base_image_id", "003", "004"),
        ("driver", "004", "005"),
    ]
    assert "the base image tag now names another image" in describe(found[0])
    assert "sha256:1 -> sha256:2" in describe(found[0])
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
