"""The lines `run` prints at the end say how sure the culprit is, or that nothing is."""

from __future__ import annotations

from pathlib import Path

from runner.cli import _print_summary

CULPRIT, OTHER = "c" * 40, "d" * 40


def report(confidence: dict, first_bad: str | None, notes: list[str]) -> dict:
    return {
        "source": "pypto" if first_bad else "inconclusive",
        "pypto": {"first_bad": first_bad, "candidates": [CULPRIT, OTHER], "commit": None},
        "simpler": None,
        "confidence": {"pypto": confidence, "simpler": None},
        "notes": notes,
    }


def test_a_confident_culprit_prints_its_probability_the_runner_up_and_the_flake_rates(capsys):
    level = {
        "probability": 0.963,
        "runner_up": {"sha": OTHER, "probability": 0.021},
        "false_fail": 0.08,
        "false_pass": 0.11,
        "low_confidence": None,
    }
    _print_summary(report(level, CULPRIT, []), Path("report.md"))
    out = capsys.readouterr().out
    assert "probability 96.3%, runner-up dddddddddddd 2.1%" in out
    assert "false fail 8.0%, false pass 11.0%" in out


def test_low_confidence_and_drift_are_printed_as_such(capsys):
    level = {
        "probability": None,
        "runner_up": None,
        "false_fail": 0.3,
        "false_pass": 0.3,
        "low_confidence": [
            {"sha": CULPRIT, "probability": 0.6},
            {"sha": OTHER, "probability": 0.3},
        ],
    }
    drift = "the environment drifted during the session: the known-good commit now fails"
    _print_summary(report(level, None, [drift]), Path("report.md"))
    out = capsys.readouterr().out
    assert "inconclusive: low confidence; candidates: cccccccccccc 60%, dddddddddddd 30%" in out
    assert f"warning: {drift}" in out


def test_a_culprit_found_before_the_environment_drifted_is_not_headlined_as_the_answer(capsys):
    level = {
        "probability": 0.035,
        "runner_up": {"sha": OTHER, "probability": 0.686},
        "false_fail": 0.2,
        "false_pass": 0.1,
        "low_confidence": None,
    }
    drifted = {**report(level, CULPRIT, []), "drift": ["the known-good commit"]}
    _print_summary(drifted, Path("report.md"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "regression source: pypto (not trusted: the environment drifted, see below)"
    assert lines[1].startswith(f"first bad pypto commit the search found: {CULPRIT}")


def test_the_devices_of_tests_on_several_cards_are_not_taken_for_earlier_runs() -> None:
    from datetime import datetime, timezone

    from runner.ledger import LedgerDocument
    from runner.report import _devices
    from tests.fixtures.attempts import recorded
    from tests.test_ledger import make_inputs

    inputs = make_inputs(Path("/tmp"), devices=["0", "1", "2", "3"])
    attempts = [recorded("001", device="0,1"), recorded("002", device="2,3")]
    doc = LedgerDocument(
        tool_version="0", created_at=datetime.now(timezone.utc), inputs=inputs, attempts=attempts
    )
    assert _devices(doc) == "device 0,1,2,3"
    moved = doc.model_copy(update={"attempts": [*attempts, recorded("003", device="4,5")]})
    assert _devices(moved) == "device 0,1,2,3 (earlier runs also on 4,5)"
