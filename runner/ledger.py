"""The JSON ledger: the one record of a bisect session.

It drives the search (verdicts already recorded are reused), makes a run resumable and
replayable, and must survive a crash or a full disk at any moment. Hence: one exclusive lock
per ledger, every write is a whole new document swapped in with ``os.replace``, and a file we
cannot read is refused and left exactly as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Literal

from filelock import FileLock, Timeout
from pydantic import (
    BaseModel,
    ConfigDict,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticSerializationError

from runner.errors import BadInput, InfrastructureError, LedgerError
from runner.search import Verdict
from runner.verdict import Tolerance

LEDGER_SCHEMA_VERSION = 1
TOOL_NAME = "bisect-precision-docker"

Level = Literal["pypto", "simpler", "split", "drift"]
"""Which history an attempt belongs to; ``split`` = the code-vs-pointer half tests of a bump,
``drift`` = the re-runs of good commits at the end of a session."""

GitSha = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")]
"""A full lowercase object name (SHA-1, or SHA-256 for such repositories).

Abbreviations are refused: they become ambiguous as history grows, and the shas end up in a
``git bisect replay`` script.
"""

_TEMP_SUFFIX = ".tmp"
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})


class _Strict(BaseModel):
    # Unknown fields are refused so that a foreign or newer file is never half-read.
    # NaN/Infinity are written as the JSON5-style constants Python's json reads back, because a
    # precision metric such as "max abs diff" can legitimately be NaN.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class SessionInputs(_Strict):
    """What identifies a session: a ledger is only valid for the inputs it was made for."""

    pypto_repo: str
    lib_repo: str
    script: str
    good: GitSha
    bad: GitSha
    platform: str
    devices: list[str]
    base_image: str
    base_image_id: str
    submodule_path: str = "runtime"
    extra_args: list[str] = []
    settings_digest: str = ""

    def checkout(self) -> Path:
        """The session's pypto checkout; bad input when it is no longer where the session
        found it (a session is tied to its path: a moved checkout is another input)."""
        path = Path(self.pypto_repo)
        if not path.is_dir():
            raise BadInput(
                f"the session's pypto checkout {path} is not there any more (moved or deleted?); "
                f"put it back, or link it there (ln -s NEW_PATH {path}), to read this session"
            )
        return path


LOCAL_NODE = "local"  # an attempt run on this host (the local executor's node)


def placement(device: str, node: str | None) -> str:
    """Where an example ran, as reports name it: the device, and its node when not this host."""
    return f"{device}@{node}" if node and node != LOCAL_NODE else device


class Attempt(_Strict):
    """One tested (pypto, simpler) pair: what was built, how it ran, and the verdict."""

    run_id: str
    level: Level
    pypto_sha: GitSha
    simpler_sha: GitSha | None
    verdict: Verdict
    reason: str = ""
    exit_code: int | None = None
    build_s: float = 0.0
    run_s: float = 0.0
    image_id: str | None = None
    wheel_digests: dict[str, str] = {}
    builds: dict[str, str] = {}
    log_path: str | None = None
    artifacts_dir: str | None = None
    metrics: dict[str, float | int | str] = {}
    device: str | None = None
    node: str | None = None  # the host that ran the example (the Ray executor's node)
    round: int | None = None  # attempts of one round ran at once, one per device
    # Per package: the builder image id, its exact build tools, and ccache [hits, misses].
    builders: dict[str, str] = {}
    build_tools: dict[str, list[str]] = {}
    ccache: dict[str, list[int]] = {}
    export_s: float = 0.0
    # Where the attempt ran: base image id and digest, pip freeze and CANN of the image, host
    # driver, npu-smi, kernel, device (see runner/fingerprint.py).
    fingerprint: dict[str, str] = {}
    # Per package: a digest of the files inside the wheel (runner/noop.py), for the no-op check.
    wheel_contents: dict[str, str] = {}
    started_at: datetime
    finished_at: datetime


class Invocation(_Strict):
    """One `run` of the session (resumes included): the session's wall time is their sum."""

    started_at: datetime
    wall_s: float


class AheadBuild(_Strict):
    """A wheel built speculatively, while an example ran, before any test asked for it."""

    package: str
    commit: GitSha
    ok: bool
    seconds: float
    ccache: list[int] = []
    finished_at: datetime


def judged(attempt: Attempt, tolerance: Tolerance | None) -> Attempt:
    """The attempt as the session's limits judge it from its figures: what the search used, and
    so what progress lines, the report, its plot and `reproduce` show. The example's own
    verdict stays in the reason."""
    if tolerance is None or not tolerance.active:
        return attempt
    verdict, reason = tolerance.judge(attempt.verdict, attempt.reason, attempt.metrics)
    if verdict is attempt.verdict:
        return attempt
    return attempt.model_copy(update={"verdict": verdict, "reason": reason})


class LedgerDocument(_Strict):
    """The whole file. Attempts are kept in the order they were recorded."""

    tool: Literal["bisect-precision-docker"] = TOOL_NAME
    schema_version: int = LEDGER_SCHEMA_VERSION
    tool_version: str
    created_at: datetime
    inputs: SessionInputs
    attempts: list[Attempt] = []
    invocations: list[Invocation] = []
    ahead: list[AheadBuild] = []  # builds made ahead of need (cache hits of later attempts)
    # Test images layered ahead of need, by id: `cleanup --images --workdir` removes them too.
    ahead_images: list[str] = []
    # Attempts kept for the record but no longer counted: skips for sources the checkout lacked
    # then and holds now (`Ledger.supersede`).
    superseded: list[str] = []

    @property
    def wall_s(self) -> float | None:
        """The session's wall time over every invocation; None for a ledger that predates it."""
        if not self.invocations:
            return None
        return sum(invocation.wall_s for invocation in self.invocations)

    @model_validator(mode="after")
    def _run_ids_are_unique(self) -> LedgerDocument:
        # run_id names runs/<run_id>/: two attempts sharing one would share logs and artifacts.
        seen: set[str] = set()
        for attempt in self.attempts:
            if attempt.run_id in seen:
                raise ValueError(f"run_id {attempt.run_id!r} appears more than once")
            seen.add(attempt.run_id)
        return self

    def find(self, pypto_sha: str, simpler_sha: str | None) -> Attempt | None:
        """The latest counted attempt for exactly this pair (``simpler_sha`` None = no runtime
        gitlink)."""
        found = self.find_all(pypto_sha, simpler_sha)
        return found[-1] if found else None

    def judged(self, tolerance: Tolerance | None) -> LedgerDocument:
        """This ledger with every attempt as `judged` by the limits (itself when none)."""
        if tolerance is None or not tolerance.active:
            return self
        return self.model_copy(
            update={"attempts": [judged(attempt, tolerance) for attempt in self.attempts]}
        )

    def counted(self) -> list[Attempt]:
        """The attempts that count, in recording order: all but the superseded ones."""
        if not self.superseded:
            return self.attempts
        dropped = set(self.superseded)
        return [attempt for attempt in self.attempts if attempt.run_id not in dropped]

    def find_all(self, pypto_sha: str, simpler_sha: str | None) -> list[Attempt]:
        """Every counted attempt for exactly this pair, in recording order (a flaky example is
        re-run); superseded ones are left out."""
        return [
            attempt
            for attempt in self.counted()
            if attempt.pypto_sha == pypto_sha and attempt.simpler_sha == simpler_sha
        ]

    def named(self, run_id: str) -> list[Attempt]:
        """The attempts a user names: by run id or its number (`7` or `007` for `007-...`; a
        number of four digits or more that also starts a pypto SHA is refused as ambiguous),
        else by a pypto SHA (prefix). A SHA names that commit's own attempts, the pypto level's
        (its verdict in the bisect) before those of the levels that ran it with other simpler
        commits, in recording order."""
        if not run_id:
            return []
        exact = [a for a in self.attempts if a.run_id == run_id]
        if exact:
            return exact[:1]
        matches = [a for a in self.attempts if a.pypto_sha.startswith(run_id.lower())]
        if run_id.isdigit():
            numbered = [a for a in self.attempts if _run_number(a.run_id) == int(run_id)]
            commits = {a.pypto_sha for a in matches}
            # Under four digits it is a number: git abbreviates a SHA to four at the least.
            short = len(run_id) < 4
            if numbered and commits and commits != {numbered[0].pypto_sha} and not short:
                raise BadInput(
                    f"{run_id!r} is both run {numbered[0].run_id} and a prefix of pypto "
                    f"{matches[0].pypto_sha[:12]}; give the whole run id or more of the SHA"
                )
            if numbered:
                return numbered[:1]
        commits = sorted({a.pypto_sha for a in matches})
        if len(commits) > 1:
            raise BadInput(
                f"{run_id!r} matches several commits ({', '.join(c[:12] for c in commits)}); "
                "give more of the SHA, or a run id from `status`"
            )
        own = [a for a in matches if a.level == "pypto"]
        return own or matches

    def check_range(self, commits: Collection[str], path: Path) -> None:
        """Refuse a ledger with an attempt of a pypto commit outside the session's range
        (`commits`, the good end included; the second level and the split run such commits
        too): it was edited by hand, and the search would neither use that attempt nor say so."""
        known = set(commits)
        for attempt in self.attempts:
            if attempt.pypto_sha not in known:
                raise LedgerError(
                    f"ledger {path}: attempt {attempt.run_id} tests pypto "
                    f"{attempt.pypto_sha[:12]}, which is not in this session's range "
                    f"{self.inputs.good[:12]}..{self.inputs.bad[:12]}; it was left untouched: "
                    f"{_start_over(path)}"
                )

    def skips(self, reason: str) -> list[Attempt]:
        """Counted skips whose reason starts with `reason`: SOURCE_UNAVAILABLE (the checkout
        lacked their sources when they were tried) or USER_SKIP (--skip)."""
        return [
            a for a in self.counted() if a.verdict is Verdict.SKIP and a.reason.startswith(reason)
        ]


def _run_number(run_id: str) -> int | None:
    """The number of a run id or run folder (`007-...`), as `claim_run_dir` numbers them."""
    found = _RUN_NUMBER.match(run_id)
    return int(found.group(1)) if found else None


class Ledger:
    """An open, locked ledger. Use :meth:`open`; close it (or use ``with``) to release the lock."""

    def __init__(
        self,
        path: Path,
        lock: FileLock,
        document: LedgerDocument,
        backup: Path | None = None,
        created: bool = False,
    ) -> None:
        self._path = path
        self._lock: FileLock | None = lock
        self._document = document
        self.backup = backup
        """Where `--new-session` moved the earlier session's ledger, if it did."""
        self._created = created  # this open wrote the file, into a workdir that had none
        self._invocation: float | None = None
        self._invocation_at: datetime | None = None  # when it began, by the wall clock

    @classmethod
    def open(
        cls,
        path: Path,
        inputs: SessionInputs,
        *,
        tool_version: str,
        new_session: bool = False,
    ) -> Ledger:
        """Lock ``path`` and load it, or start a new document when there is none.

        An existing ledger for other inputs is refused unless ``new_session``, which moves any
        existing file aside as ``<name>.<UTC timestamp>.bak`` (byte-identical) and starts over.
        """
        path = Path(path).absolute()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InfrastructureError(
                f"cannot create the ledger directory {path.parent}: {_reason(exc)}; "
                "check the --workdir path and its permissions"
            ) from exc
        lock_path = _lock_path(path)
        lock = FileLock(str(lock_path))
        try:
            lock.acquire(blocking=False)
        except Timeout as exc:
            raise LedgerError(
                f"ledger {path} is in use by another run (lock {lock_path}); "
                "wait for it or use another --workdir"
            ) from exc
        except OSError as exc:
            raise InfrastructureError(
                f"cannot lock the ledger {path} ({lock_path}): {_reason(exc)}; "
                "check the --workdir permissions"
            ) from exc
        try:
            _remove_stale_temp_files(path)
            document: LedgerDocument | None = None
            backup: Path | None = None
            if path.exists() or path.is_symlink():
                if new_session:
                    backup = _back_up(path)
                else:
                    document = _load(path)
                    _check_same_session(path, document.inputs, inputs)
                    if document.inputs.devices != inputs.devices:
                        # Which cards run the tests is a choice of this run (a card may have
                        # left the host); each attempt records its own, and every verdict stays.
                        moved = document.inputs.model_copy(update={"devices": inputs.devices})
                        document = document.model_copy(update={"inputs": moved})
                        _atomic_write(path, _serialize(document))
            created = False
            if document is None:
                document = LedgerDocument(
                    tool_version=tool_version,
                    created_at=datetime.now(timezone.utc),
                    inputs=inputs.model_copy(deep=True),
                )
                _atomic_write(path, _serialize(document))
                created = backup is None
            return cls(path, lock, document, backup, created)
        except BaseException:
            lock.release()
            raise

    @staticmethod
    def read(path: Path) -> LedgerDocument:
        """Load a ledger without locking it (status, report): writers only ever swap whole files."""
        path = Path(path)
        if path.parent.is_file():
            raise LedgerError(f"--workdir {path.parent} is a file, not a directory")
        if not (path.exists() or path.is_symlink()):
            raise LedgerError(f"no ledger at {path}: start a bisect with `run` (or pass --workdir)")
        return _load(path)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def document(self) -> LedgerDocument:
        return self._document

    def record(self, attempt: Attempt) -> None:
        """Append ``attempt`` and persist the whole ledger before returning.

        The new document is validated as it will be read back before it replaces the old file, so
        an attempt that was mutated into an invalid state can never make the ledger unreadable.
        """
        self._require_open()
        if any(known.run_id == attempt.run_id for known in self._document.attempts):
            raise LedgerError(
                f"run {attempt.run_id!r} is already in the ledger {self._path}; "
                "every attempt needs a new run_id"
            )
        candidate = self._document.model_copy(
            update={
                "attempts": [*self._document.attempts, attempt],
                "invocations": self._invocations(),
            }
        )
        try:
            text = _serialize(candidate)
            checked = LedgerDocument.model_validate_json(text)
        except (PydanticSerializationError, ValidationError) as exc:
            raise LedgerError(
                f"refusing to record run {attempt.run_id!r} in {self._path}: it is not a valid "
                f"attempt ({_summarize(exc)}); the ledger was left unchanged"
            ) from exc
        _atomic_write(self._path, text)
        self._document = checked

    def find(self, pypto_sha: str, simpler_sha: str | None) -> Attempt | None:
        return self._document.find(pypto_sha, simpler_sha)

    def record_ahead(self, builds: list[AheadBuild], images: Sequence[str] = ()) -> None:
        """Keep the speculative builds that finished, for the build counts of the report, and
        the test images layered ahead, for `cleanup`."""
        self._require_open()
        fresh = [i for i in dict.fromkeys(images) if i not in self._document.ahead_images]
        if not builds and not fresh:
            return
        candidate = self._document.model_copy(
            update={
                "ahead": [*self._document.ahead, *builds],
                "ahead_images": [*self._document.ahead_images, *fresh],
            }
        )
        _atomic_write(self._path, _serialize(candidate))
        self._document = candidate

    def start_invocation(self, started: float) -> None:
        """Count this invocation from ``started`` (``time.monotonic()``) until it is finished."""
        self._invocation = started
        self._invocation_at = datetime.now(timezone.utc) - timedelta(
            seconds=time.monotonic() - started
        )

    def _invocations(self) -> list[Invocation]:
        """The session's invocations with this one's wall time so far: every recorded attempt
        brings it up to date, so a run killed outright (SIGKILL, a lost machine) still counts
        up to its last attempt in the session's wall time."""
        invocations = list(self._document.invocations)
        if self._invocation is None or self._invocation_at is None:
            return invocations
        if invocations and invocations[-1].started_at == self._invocation_at:
            invocations.pop()  # this one's entry as the last recorded attempt left it
        wall_s = round(time.monotonic() - self._invocation, 3)
        return [*invocations, Invocation(started_at=self._invocation_at, wall_s=wall_s)]

    def abandon_invocation(self) -> Path | None:
        """Forget this invocation: it stopped on bad input before it tested anything, so it
        is not part of the session (its wall time included). A ledger this invocation created
        goes too: it would hold the workdir for the rejected inputs, and the corrected command
        would be told the workdir belongs to another session. So does a `--new-session` one:
        the earlier session's ledger is put back, and its backup's path returned (the caller
        puts back the files that went with it)."""
        self._invocation = None
        if self._document.attempts:
            return None
        if self._created:
            self._path.unlink(missing_ok=True)
        if self.backup is None:
            return None
        backup, self.backup = self.backup, None
        os.replace(backup, self._path)
        return backup

    def finish_invocation(self) -> float:
        """Add this invocation's wall time to the session's and persist it; returns it.

        `close` finishes an invocation nobody finished (an interrupt, an infrastructure
        failure), so the session's wall time counts every minute spent on it.
        """
        self._require_open()
        if self._invocation is None:
            return 0.0
        # The figure returned is the one recorded, so a first invocation's own wall time and
        # the session's (summed from the ledger) are the same number, not one rounding apart.
        invocations = self._invocations()
        self._invocation = None
        candidate = self._document.model_copy(update={"invocations": invocations})
        _atomic_write(self._path, _serialize(candidate))
        self._document = candidate
        return invocations[-1].wall_s

    def supersede(self, run_ids: Sequence[str]) -> None:
        """Stop counting these attempts (they stay in the file): their pair is tested anew."""
        self._require_open()
        if not run_ids:
            return
        known = {a.run_id for a in self._document.attempts}
        unknown = sorted(set(run_ids) - known)
        if unknown:
            raise LedgerError(f"cannot supersede runs the ledger lacks: {', '.join(unknown)}")
        merged = list(dict.fromkeys([*self._document.superseded, *run_ids]))
        candidate = self._document.model_copy(update={"superseded": merged})
        _atomic_write(self._path, _serialize(candidate))
        self._document = candidate

    def attempts_for(self, level: Level) -> list[Attempt]:
        return [attempt for attempt in self._document.attempts if attempt.level == level]

    def close(self) -> None:
        """Release the lock; the document stays readable, but nothing more can be recorded."""
        if self._lock is not None and self._invocation is not None:
            with contextlib.suppress(InfrastructureError):
                self.finish_invocation()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require_open(self) -> None:
        if self._lock is None:
            raise LedgerError(f"ledger {self._path} is closed; open it again to record attempts")


def to_git_bisect_log(
    doc: LedgerDocument,
    subjects: Mapping[str, str] | None = None,
    *,
    pins: Mapping[str, str | None] | None = None,
    first_parent: bool = True,
    order: Sequence[str] | None = None,
    boundary: str | None = None,
) -> str:
    """A ``git bisect log`` of the pypto-level attempts, for ``git bisect replay``.

    The pypto level searches the first-parent chain, so the log starts with ``--first-parent``:
    without it git would also offer the commits of merged branches, and replay another search.

    ``pins`` (commit -> its runtime pointer): the runs of a commit at its own pointer that a
    later stage recorded (the joint descent re-runs them) count too; without it, the pypto
    stage's alone.

    Each commit appears once, at the place of its latest run, with the verdict most of its runs
    gave (the latest one's on a tie): git keeps only one bad ref but a good ref per commit, so
    replaying both verdicts of a flaky commit would leave it good and bad at once. A commit whose
    runs disagree gets a comment with the counts. The endpoints come from ``git bisect start``;
    attempts on them (endpoint checks) add nothing for git.

    ``order``: the range's first-parent chain, oldest first. A flaky session's majorities can
    contradict it (a good commit after a bad one), which git refuses to replay ("was both good
    and bad"); then, and whenever ``boundary`` (the session's first bad commit) is given, every
    tested commit is marked by its side of one boundary: ``boundary``, or the one fewest runs
    disagree with. A commit marked against most of its runs says so in its comment.
    """
    subjects = subjects or {}
    good, bad = doc.inputs.good, doc.inputs.bad
    runs: dict[str, list[Attempt]] = {}
    for attempt in doc.attempts:
        sha = attempt.pypto_sha
        own = pins is not None and sha in pins and attempt.simpler_sha == pins[sha]
        if sha in (good, bad) or not (
            attempt.level == "pypto" or (own and attempt.level != "drift")
        ):
            continue
        runs[sha] = [*runs.pop(sha, []), attempt]

    def comment(term: str, sha: str) -> str:
        subject = subjects.get(sha, "").splitlines()
        return f"# {term}: [{sha}] {subject[0]}" if subject else f"# {term}: [{sha}]"

    option = "'--first-parent' " if first_parent else ""
    lines = [
        comment("bad", bad),
        comment("good", good),
        f"git bisect start {option}'{bad}' '{good}'",
    ]
    counts = {
        sha: (
            sum(a.verdict is Verdict.GOOD for a in seen),
            sum(a.verdict is Verdict.BAD for a in seen),
        )
        for sha, seen in runs.items()
    }
    terms: dict[str, str] = {}
    for sha, seen in runs.items():
        judged = [a.verdict for a in seen if a.verdict is not Verdict.SKIP]
        passes, fails = counts[sha]
        terms[sha] = Verdict.SKIP.value
        if judged:
            terms[sha] = (judged[-1] if passes == fails else max(judged, key=judged.count)).value
    sides = _sides(order, counts, terms, boundary) if order is not None else None
    for sha in runs:
        passes, fails = counts[sha]
        term = terms[sha]
        why = "the latest one's" if passes == fails else "most of them"
        if sides is not None and sha in sides[0] and term != Verdict.SKIP.value:
            side = sides[0][sha]
            if side != term or (passes and fails):
                term, why = side, sides[1]
        if (passes and fails) or term != terms[sha]:
            lines.append(f"# {passes} passing and {fails} failing runs: {term}, as {why}")
        lines += [comment(term, sha), f"git bisect {term} {sha}"]
    return "\n".join(lines) + "\n"


def _sides(
    order: Sequence[str],
    counts: Mapping[str, tuple[int, int]],
    terms: Mapping[str, str],
    boundary: str | None,
) -> tuple[dict[str, str], str] | None:
    """Each tested commit's side of one boundary in `order` (see `to_git_bisect_log`), and why;
    None when the majorities already agree with the order and no boundary is given."""
    place = {sha: i for i, sha in enumerate(order)}
    tested = sorted((place[sha], sha) for sha in counts if sha in place)
    marks = [terms[sha] for _, sha in tested if terms[sha] != Verdict.SKIP.value]
    ordered = marks == sorted(marks, key=lambda term: term == Verdict.BAD.value)
    if boundary in place:
        first, why = place[boundary], f"the session's first bad commit {boundary[:12]} puts it"
    elif ordered:
        return None
    else:
        # The boundary fewest runs disagree with: fails before it, passes from it on.
        def disagreeing(k: int) -> int:
            return sum(counts[sha][1] if i < k else counts[sha][0] for i, sha in tested)

        # (among equals, a tested commit, so that the replay names it: the earliest)
        first = min(
            range(1, len(order)),
            key=lambda k: (disagreeing(k), order[k] not in counts, k),
        )
        why = "the boundary fewest runs disagree with puts it"
    sides = {sha: Verdict.GOOD.value if i < first else Verdict.BAD.value for i, sha in tested}
    return sides, why


_RUN_NUMBER = re.compile(r"^(\d+)-")


def claim_run_dir(runs: Path, name: str, taken: Iterable[str] = ()) -> tuple[str, Path]:
    """Create a run folder ``NNN-<name>`` that no session of this workdir has used.

    Numbers continue after the highest one in ``runs`` and in ``taken`` (the ledger's run ids), and
    the folder is made exclusively: a folder is never reused or emptied, so the backup ledger of an
    earlier session, and an attempt retried after an infrastructure fault, keep their evidence.
    """
    runs.mkdir(parents=True, exist_ok=True)
    names = [*os.listdir(runs), *taken]
    number = max((n for entry in names if (n := _run_number(entry)) is not None), default=0)
    while True:
        number += 1
        run_id = f"{number:03d}-{name}"
        try:
            (runs / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id, runs / run_id


def earlier_sessions(path: Path) -> dict[str, Path]:
    """The backups `--new-session` made of the ledger at ``path``, by session name, oldest first."""
    prefix, suffix = f"{path.name}.", ".bak"
    found = {
        backup.name[len(prefix) : -len(suffix)]: backup
        for backup in path.parent.glob(f"{path.name}.*{suffix}")
    }
    return dict(sorted(found.items()))


def earlier_session(path: Path, name: str) -> Path:
    """The backup ledger called ``name``: its timestamp, its file name or its path."""
    sessions = earlier_sessions(path)
    key = Path(name).name.removeprefix(f"{path.name}.").removesuffix(".bak")
    if key in sessions:
        return sessions[key]
    known = ", ".join(sessions) or "none"
    raise LedgerError(f"no earlier session {name!r} in {path.parent} (earlier sessions: {known})")


def session_name(backup: Path) -> str:
    """The name `--session` takes for the session backed up as ``backup``: its timestamp."""
    return backup.name.split(".")[-2]


def session_folder(workdir: Path, backup: Path) -> Path:
    """Where the reports and reproductions of the earlier session backed up as `backup` go."""
    return workdir / "sessions" / session_name(backup)


def session_copy(backup: Path, name: str) -> Path:
    """Where a file of the session backed up as ``backup`` is kept, e.g. its settings.json."""
    return backup.with_name(f"{name}.{session_name(backup)}.bak")


def in_use(path: Path) -> bool:
    """Whether a run holds the ledger at `path` now (the lock a run keeps while it writes)."""
    lock = _lock_path(path)
    if not lock.exists():
        return False
    probe = FileLock(str(lock))
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return True
    except OSError:
        return False  # a read-only workdir: nobody writes there
    probe.release()
    return False


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _serialize(document: LedgerDocument) -> str:
    return document.model_dump_json(indent=2, warnings="error") + "\n"


# Only `run` starts sessions: `status`, `report` and the others have no --new-session.
_START_OVER = (
    "move it aside, or start over with `run ... --new-session` (which keeps the old file as "
    "<name>.<time>.damaged)"
)
_EARLIER = (
    "it is an earlier session's copy, which no run writes: move it aside to drop that session"
)


def _start_over(path: Path) -> str:
    """What to do about a ledger that cannot be used: an earlier session's copy is not started
    over, it is only read."""
    return _EARLIER if path.name.endswith(".bak") else _START_OVER


def _load(path: Path) -> LedgerDocument:
    untouched = "it was left untouched"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {_reason(exc)}") from exc
    try:
        data: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LedgerError(
            f"ledger {path} is not valid JSON ({exc}); {untouched}: {_start_over(path)}"
        ) from exc
    except RecursionError as exc:  # arrays nested thousands deep: nothing the tool wrote
        raise LedgerError(
            f"ledger {path} is not a ledger (JSON nested too deep to read); {untouched}: "
            f"{_start_over(path)}"
        ) from exc
    if not isinstance(data, dict) or data.get("tool") != TOOL_NAME:
        tool = data.get("tool") if isinstance(data, dict) else None
        who = f"it says tool={tool!r}" if tool is not None else "it has no 'tool' field"
        raise LedgerError(
            f"{path} is not a {TOOL_NAME} ledger ({who}); {untouched}: use another --workdir"
        )
    version = data.get("schema_version")
    if type(version) is not int:
        raise LedgerError(
            f"ledger {path} has no valid schema_version ({version!r}); {untouched}: "
            f"{_start_over(path)}"
        )
    if version > LEDGER_SCHEMA_VERSION:
        raise LedgerError(
            f"ledger {path} has schema version {version}, newer than this tool's "
            f"{LEDGER_SCHEMA_VERSION}; {untouched}: upgrade {TOOL_NAME} to resume it"
        )
    try:
        document = LedgerDocument.model_validate_json(raw)
    except ValidationError as exc:
        raise LedgerError(
            f"ledger {path} is damaged ({_summarize(exc)}); {untouched}: {_start_over(path)}"
        ) from exc
    return _relocated(document, path.absolute().parent)


def _relocated(document: LedgerDocument, here: Path) -> LedgerDocument:
    """The document with its attempts' files where the ledger is now.

    Attempts record absolute paths (``<workdir>/runs/<run folder>``, the logs in it). A workdir
    moved or copied elsewhere (a CI artifact downloaded, a folder handed over) keeps those
    folders beside its ledger: the paths follow it, so the report, `reproduce` and `export` find
    them. A path outside the workdir (a build log in the wheel cache) stays as it is."""
    attempts = []
    for attempt in document.attempts:
        folder = Path(attempt.artifacts_dir) if attempt.artifacts_dir else None
        if folder is None or folder.parent.name != "runs":
            attempts.append(attempt)
            continue
        old, new = folder.parent.parent, here
        moved = new / "runs" / folder.name
        if old == new or not moved.is_dir():
            attempts.append(attempt)
            continue
        update: dict[str, str] = {"artifacts_dir": str(moved)}
        if attempt.log_path and Path(attempt.log_path).is_relative_to(old):
            update["log_path"] = str(new / Path(attempt.log_path).relative_to(old))
        attempts.append(attempt.model_copy(update=update))
    if all(a is b for a, b in zip(attempts, document.attempts, strict=True)):
        return document
    return document.model_copy(update={"attempts": attempts})


_FIELD_MEANING = {
    "settings_digest": (
        "settings_digest (build/run settings, the example's text or its pypto-lib files "
        "changed, or what --ptoas-root or --pto-isa-root hold did)"
    ),
}


def _check_same_session(path: Path, recorded: SessionInputs, wanted: SessionInputs) -> None:
    old, new = recorded.model_dump(), wanted.model_dump()
    differing = [
        name for name in SessionInputs.model_fields if old[name] != new[name] and name != "devices"
    ]
    if differing:
        details = "; ".join(
            f"{_FIELD_MEANING.get(name, name)}: {old[name]!r} -> {new[name]!r}"
            for name in differing
        )
        # A commit on the checkout's branch moved the default --bad (HEAD) on: the session
        # goes on with its own bad commit named.
        resume = (
            f"; to go on with it, pass --bad {str(old['bad'])[:12]}"
            if differing == ["bad"] and old["bad"]
            else ""
        )
        raise LedgerError(
            f"ledger {path} belongs to another session ({details}){resume}; pass --new-session "
            "to start over (the old ledger is kept as a backup)"
        )


def _back_up(path: Path) -> Path:
    """Move ``path`` aside without ever replacing an earlier backup. A ledger that cannot be
    read goes aside as ``.damaged``: kept, but no earlier session (status, report, reproduce and
    cleanup of the workdir would each stop on it)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    suffix = ".bak"
    try:
        _load(path)
    except LedgerError:
        suffix = ".damaged"
    for n in range(1000):
        backup = path.with_name(f"{path.name}.{stamp if n == 0 else f'{stamp}-{n}'}{suffix}")
        try:
            # A hard link fails when the name is taken, where a rename would silently clobber.
            os.link(path, backup, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise _backup_failed(path, backup, exc) from exc
            if backup.exists() or backup.is_symlink():
                continue
            try:
                os.rename(path, backup)
            except OSError as rename_exc:
                raise _backup_failed(path, backup, rename_exc) from rename_exc
        else:
            try:
                os.unlink(path)
            except OSError as exc:
                raise _backup_failed(path, backup, exc) from exc
        _fsync_dir(path.parent)
        return backup
    raise InfrastructureError(f"cannot find a free backup name for the ledger {path}")


def _backup_failed(path: Path, backup: Path, exc: OSError) -> InfrastructureError:
    return InfrastructureError(f"cannot back up the ledger {path} to {backup}: {_reason(exc)}")


def _atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader (or a crash) sees the old or the new file."""
    data = text.encode("utf-8")
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        mode = 0o644
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
    except OSError as exc:
        raise _write_failed(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise _write_failed(path, exc) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable across power loss; best effort, as some filesystems refuse it.

    By the time this runs the new file is already in place, so failing here would only make
    the caller's view of the ledger disagree with the disk.
    """
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_temp_files(path: Path) -> None:
    """Delete temp files a killed writer left behind; only called while holding the lock."""
    for stale in path.parent.glob(f".{path.name}.*{_TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _write_failed(path: Path, exc: OSError) -> InfrastructureError:
    return InfrastructureError(
        f"cannot write the ledger {path}: {_reason(exc)}; the previous ledger is intact: "
        "free disk space or fix permissions, then run again to resume"
    )


def _reason(exc: OSError) -> str:
    if exc.errno is not None and exc.strerror:
        return f"{exc.strerror} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc)


def _summarize(exc: ValidationError | PydanticSerializationError) -> str:
    if isinstance(exc, PydanticSerializationError):
        return str(exc)
    errors = exc.errors()
    parts = [
        f"{'.'.join(str(loc) for loc in error['loc']) or '<document>'}: {error['msg']}"
        for error in errors[:3]
    ]
    more = f" and {len(errors) - 3} more" if len(errors) > 3 else ""
    return "; ".join(parts) + more
