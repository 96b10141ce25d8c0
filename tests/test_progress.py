"""The progress output: where no live line is drawn (a CI log), a long silence prints the status."""

from __future__ import annotations

import io
import time

from rich.console import Console

from runner.progress import ConsoleProgress
from runner.search import Verdict
from tests.fixtures.attempts import recorded


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200, color_system=None), out


def _beats(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  ... ")]


def test_a_silent_log_gets_the_status_while_a_long_phase_lasts() -> None:
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=0.2) as progress:
        progress.level_started("pypto", 12, "pypto first-parent commits")
        progress.step_started("pypto", 2, 3, "fcd0203f9ff66ce0", None, "docs: a subject")
        progress.phase("build pypto fcd0203f9ff6")
        time.sleep(0.9)
    beats = _beats(out.getvalue())
    assert 2 <= len(beats) <= 5, out.getvalue()
    assert "pypto step 3/~5 · fcd0203f9ff6 · build pypto fcd0203f9ff6" in beats[0]
    assert beats[0].endswith("docs: a subject")
    settled = len(out.getvalue())
    time.sleep(0.4)
    assert len(out.getvalue()) == settled, "nothing is printed once the progress is closed"


def test_a_thread_still_finishing_after_the_progress_closed_prints_nothing() -> None:
    """Ctrl-C during a builder image's build: "interrupted" was followed by the build's own
    line from its thread ("building a builder image ..."), below the command's last word."""
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=0) as progress:
        progress.note("building wheels")
    progress.note("building a builder image with setuptools==80.9.0")
    progress.warn("a late warning")
    progress.echo("a late log line")

    assert out.getvalue() == "building wheels\n"


def test_before_its_first_step_a_level_shows_no_step_and_no_empty_commit() -> None:
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=0.2) as progress:
        progress.level_started("pypto", 12, "pypto first-parent commits")
        time.sleep(0.5)
    beats = _beats(out.getvalue())
    assert beats and beats[0].startswith("  ... pypto level · starting "), out.getvalue()
    assert "step" not in beats[0]


def test_a_log_that_keeps_printing_gets_no_status_lines() -> None:
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=0.3) as progress:
        for number in range(10):
            progress.note(f"line {number}")
            time.sleep(0.1)
    assert _beats(out.getvalue()) == []
    assert out.getvalue().count("line ") == 10


def test_a_terminal_has_the_live_line_instead() -> None:
    console, out = _console(terminal=True)
    with ConsoleProgress(console, heartbeat=0.1) as progress:
        progress.phase("run")
        time.sleep(0.35)
    assert _beats(out.getvalue()) == []


def test_quiet_progress_prints_the_warnings_and_nothing_else() -> None:
    console, out = _console(terminal=True)
    with ConsoleProgress(console, heartbeat=0.1, quiet=True) as progress:
        progress.level_started("pypto", 12, "pypto first-parent commits")
        progress.note("3 pypto verdicts reused from the ledger")
        progress.warn("the base image tag now names another image")
        time.sleep(0.3)
    assert out.getvalue() == "warning: the base image tag now names another image\n"


def test_the_status_line_counts_the_pairs_built_ahead_while_there_are_some() -> None:
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=0.2) as progress:
        progress.step_started("pypto", 2, 3, "fcd0203f9ff66ce0", None, "docs: a subject")
        progress.phase("run")
        progress.ahead(2)
        time.sleep(0.5)
        progress.ahead(0)
        time.sleep(0.5)
    beats = _beats(out.getvalue())
    assert "· run 0s · 2 pairs built ahead · docs: a subject" in beats[0], beats
    assert "built ahead" not in beats[-1], beats


def test_a_level_of_one_candidate_says_candidate() -> None:
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=10) as progress:
        progress.level_started("simpler", 1, "simpler states forward")
        progress.level_started("pypto", 12, "pypto first-parent commits")
    lines = out.getvalue().splitlines()
    assert "simpler level: 1 candidate (simpler states forward)" in lines
    assert "pypto level: 12 candidates (pypto first-parent commits)" in lines


def test_an_endpoint_check_says_what_it_checks_beside_the_step_count() -> None:
    console, out = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=0.2) as progress:
        progress.step_started(
            "pypto", 0, 8, "fcd0203f9ff66ce0", None, "a subject", "check of the known-good end"
        )
        progress.phase("run")
        time.sleep(0.3)
        progress.step_started("pypto", 2, 6, "0123456789abcdef", None, "another")
        time.sleep(0.3)
    beats = _beats(out.getvalue())
    assert "pypto step 1/~8 (check of the known-good end) · fcd0203f9ff6 · run" in beats[0]
    assert "pypto step 3/~8 · 0123456789ab" in beats[-1], beats


def test_builds_side_by_side_narrow_to_the_one_left_which_keeps_its_clock() -> None:
    console, _ = _console(terminal=False)
    with ConsoleProgress(console, heartbeat=10) as progress:
        progress.step_started("pypto", 2, 3, "fcd0203f9ff66ce0", "0a1b2c3d4e5f6a7b", "a subject")
        progress.phase("build simpler 0a1b2c3d4e5f and pypto fcd0203f9ff6")
        started = progress.phase_started
        time.sleep(0.05)
        progress.phase("build pypto fcd0203f9ff6")
        assert progress.phase_name == "build pypto fcd0203f9ff6"
        assert progress.phase_started == started
        # Another build, or the run, starts its own clock.
        time.sleep(0.01)
        progress.phase("build pypto 1111111111111111")
        assert progress.phase_started > started
        started = progress.phase_started
        time.sleep(0.01)
        progress.phase("run")
        assert progress.phase_started > started


def test_the_line_a_run_ends_with_says_what_it_checked() -> None:
    console, out = _console(terminal=False)
    attempt = recorded(
        pypto="fcd0203f9ff6" + "0" * 28, verdict=Verdict.BAD, build_s=1.25, run_s=0.5
    )
    with ConsoleProgress(console, heartbeat=10) as progress:
        progress.attempt_done(attempt, reused=False, subject="a subject", check="re-test, run 2")
        progress.attempt_done(attempt, reused=False, subject="a subject")
    first, second = out.getvalue().splitlines()
    assert first.endswith("a subject (re-test, run 2; build 1.2s run 0.5s)"), first
    assert second.endswith("a subject (build 1.2s run 0.5s)"), second
