"""One error family whose messages tell the user what to do; the CLI maps each to an exit code."""

from __future__ import annotations

import signal

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""What the tool takes as Ctrl-C: the command line stops on any of them (exit 130), and the
engine calls a stop must not cut short hold all of them back."""


class BisectError(Exception):
    """Base for every error the user can act on. The CLI prints it as one line."""

    exit_code = 2


class BadInput(BisectError):
    """A flag, revision, path or config value is wrong (exit 2)."""

    exit_code = 2


class UnbuildableCommit(BadInput):
    """A commit's own build configuration cannot be read (its pyproject.toml is not TOML, or its
    build requirements are not valid): that commit cannot be built, so a test of it is a skip;
    at an endpoint, before anything runs, it is bad input."""

    def __init__(self, message: str, package: str, detail: str) -> None:
        super().__init__(message)
        self.package = package
        self.detail = detail

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # across a Ray task
        return type(self), (str(self), self.package, self.detail)


class EndpointsDoNotReproduce(BisectError):
    """Known-good is bad or known-bad is good: the environment, not a commit, is suspect."""

    exit_code = 3
    report: dict | None = None  # the report written for the stop (`run --json` prints it)


class InfrastructureError(BisectError):
    """The Docker Engine, the disk or the cache failed; nothing is learnt about the commit."""

    exit_code = 4


class ExampleStopped(InfrastructureError):
    """An example run that timed out or ran out of memory: not a verdict, and not the card's
    fault either (the same commit does it on every card), so the card stays in the pool."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out

    def __reduce__(self) -> tuple[type, tuple[str, bool]]:  # a Ray task's
        return type(self), (str(self), self.timed_out)


class BuildTimedOut(InfrastructureError):
    """A wheel build ran past --build-timeout: a slow host, or a build that hangs."""

    def __init__(self, message: str, package: str, commit: str, seconds: float, log: str) -> None:
        super().__init__(message)
        self.package = package
        self.commit = commit
        self.seconds = seconds
        self.log = log

    def __reduce__(self) -> tuple[type, tuple[str, str, str, float, str]]:  # a Ray task's
        return type(self), (str(self), self.package, self.commit, self.seconds, self.log)


class LedgerError(BisectError):
    """The ledger is locked, corrupt, foreign or belongs to other inputs (exit 2)."""

    exit_code = 2


SOURCE_UNAVAILABLE = "source unavailable"
"""How the exporter's messages start, and so the reason of an attempt it refused."""
USER_SKIP = "skipped by --skip"
"""The reason of an attempt the user took as untestable: nothing was built or run."""


class SourceUnavailable(BisectError):
    """A commit (or a submodule commit it pins) is not in any local object store.

    Not fatal for a bisect: the session records the commit as untestable.
    """

    exit_code = 2

    def __init__(self, message: str, *, submodule: str | None = None) -> None:
        super().__init__(message)
        self.submodule = submodule


INFRASTRUCTURE_LOG = "infrastructure.log"
"""Beside the ledger: infrastructure faults (retried, never verdicts), one line each."""
RETIRED = "taken out of the pool: device"
"""Marks the infrastructure log's line of a device that left the pool."""
