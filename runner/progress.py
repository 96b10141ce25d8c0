"""Terminal progress of a bisect: level, step n of about m, commit, phase and elapsed time."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from runner.ledger import Attempt, Level
from runner.verdict import clean_output
from runner.wording import counted

VERDICT_STYLE = {"good": "green", "bad": "red", "skip": "yellow"}

# Where there is no live status line (a CI log, a file), the status is printed after this many
# seconds without a line: a cold pypto wheel takes minutes, and a silent log looks hung (some CI
# systems stop a job that prints nothing for ten minutes).
HEARTBEAT_S = 60.0


class ConsoleProgress:
    """Session events rendered with rich; one live status line plus a line per finished step.

    Without a terminal the live line is not drawn; the status is printed instead whenever
    `heartbeat` seconds pass without a line. ``quiet`` (``--json``) prints warnings only: stdout
    carries the JSON, and a warning (a device left out, the environment changing mid-session)
    must still reach a CI log.
    """

    def __init__(
        self, console: Console, heartbeat: float = HEARTBEAT_S, *, quiet: bool = False
    ) -> None:
        self.console = console
        self.quiet = quiet
        self.heartbeat = 0.0 if quiet else heartbeat
        self.printed = time.monotonic()
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None
        self.subject = ""
        self.check = ""
        self.level: Level = "pypto"
        self.done = 0
        self.left = 0
        self.commit = ""
        self.simpler: str | None = None
        self.phase_name = "starting"
        self.phase_started = time.monotonic()
        self.guessing = 0  # pairs built ahead, for outcomes the running tests may bring
        self.live = Live(console=console, refresh_per_second=4, transient=True)
        self.live.update(_Status(self))

    def __enter__(self) -> ConsoleProgress:
        if self.console.is_terminal and not self.quiet:
            self.live.start()
        elif self.heartbeat > 0:
            self._beats = threading.Thread(target=self._beat, name="progress", daemon=True)
            self._beats.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.join()
        self.live.stop()

    def _print(self, line: str | Text, highlight: bool | None = None) -> None:
        # Once the progress is over (the run ended or was interrupted), a build still finishing
        # in a thread must not print below the command's last line.
        if self.quiet or self._stop.is_set():
            return
        self.printed = time.monotonic()
        self.console.print(line, highlight=highlight)

    def _beat(self) -> None:
        while not self._stop.wait(max(self.heartbeat - (time.monotonic() - self.printed), 0.0)):
            if time.monotonic() - self.printed >= self.heartbeat:
                self._print(Text(f"  ... {_Status(self).__rich__().plain}", style="cyan"))

    def level_started(self, level: Level, count: int, note: str) -> None:
        self.level, self.done, self.left = level, 0, 1
        self.commit, self.simpler, self.subject, self.check = "", None, "", ""
        self.phase("starting")
        self._print(f"[bold]{level} level[/bold]: {counted(count, 'candidate')} ({note})")

    def step_started(
        self,
        level: Level,
        done: int,
        left: int,
        pypto: str,
        simpler: str | None,
        subject: str,
        check: str = "",
    ) -> None:
        """`check`: what a test of an endpoint checks ("check of the known-good end"), shown
        beside the step count, since such a test narrows nothing."""
        self.level, self.done, self.left = level, done, left
        self.commit, self.simpler, self.subject = pypto, simpler, subject
        self.check = check
        self.phase("prepare")

    def ahead(self, count: int) -> None:
        self.guessing = count

    def phase(self, name: str) -> None:
        # Builds side by side ("build simpler X and pypto Y") narrow to the one left as the
        # other ends: that one keeps its clock.
        before, after = self.phase_name.partition("build ")[2], name.partition("build ")[2]
        narrows = (
            self.phase_name.startswith("build ")
            and name.startswith("build ")
            and after in before.split(" and ")
        )
        self.phase_name = name
        if not narrows:
            self.phase_started = time.monotonic()

    def attempt_done(self, attempt: Attempt, reused: bool, subject: str, check: str = "") -> None:
        """`check`: what the run checked beside narrowing the range ("re-test, run 2")."""
        verdict = attempt.verdict.value
        style = VERDICT_STYLE.get(verdict, "white")
        where = f"pypto {attempt.pypto_sha[:12]}"
        if attempt.level != "pypto" and attempt.simpler_sha:
            where += f" simpler {attempt.simpler_sha[:12]}"
        origin = (
            "from the ledger"
            if reused
            else f"build {attempt.build_s:.1f}s run {attempt.run_s:.1f}s"
        )
        if check:
            origin = f"{check}; {origin}"
        reason = f" - {attempt.reason}" if attempt.reason else ""
        self._print(
            f"  [{style}]{verdict:4}[/{style}] {attempt.level:7} {where} "
            + escape(f"{subject[:50]} ({origin}){reason}"),
            highlight=False,
        )

    def note(self, text: str) -> None:
        self._print(escape(text))

    def warn(self, text: str) -> None:
        if self._stop.is_set():
            return
        self.printed = time.monotonic()
        self.console.print(Text(f"warning: {text}", style="yellow"), highlight=False)

    def echo(self, line: str) -> None:
        """A build or run log line (--verbose), without the colour codes tools put in logs."""
        self._print(Text(clean_output(line).rstrip("\n"), style="dim"))


class _Status:
    def __init__(self, progress: ConsoleProgress) -> None:
        self.progress = progress

    def __rich__(self) -> Text:
        p = self.progress
        elapsed = time.monotonic() - p.phase_started
        subject = p.subject
        simpler = f" + simpler {p.simpler[:12]}" if p.level != "pypto" and p.simpler else ""
        if not p.commit:  # the level is being planned: no step yet
            line = f"{p.level} level · {p.phase_name} {elapsed:.0f}s"
            return Text(line, style="cyan", no_wrap=True, overflow="ellipsis")
        guessing = f" · {counted(p.guessing, 'pair')} built ahead" if p.guessing else ""
        check = f" ({p.check})" if p.check else ""
        # Most important first: a narrow terminal crops the end of the line.
        return Text(
            f"{p.level} step {p.done + 1}/~{p.done + max(p.left, 1)}{check} · "
            f"{p.commit[:12]}{simpler}"
            f" · {p.phase_name} {elapsed:.0f}s{guessing} · {subject}",
            style="cyan",
            no_wrap=True,
            overflow="ellipsis",
        )
