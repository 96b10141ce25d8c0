"""`reproduce`: a recorded attempt run again in a fresh container, with its own session's
settings, and its wheels compared with the ones the verdict was made with."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner import __version__
from runner.config import Settings
from runner.errors import USER_SKIP, BadInput
from runner.inputs import SNAPSHOTS, snapshot
from runner.ledger import (
    Attempt,
    Ledger,
    LedgerDocument,
    earlier_session,
    earlier_sessions,
    judged,
    session_copy,
    session_folder,
)
from runner.prepare import Prepared, prepare
from runner.search import Verdict
from runner.workflow import (
    LEDGER_NAME,
    SETTINGS_NAME,
    docker_tester,
    existing_cache,
    ledger_path,
    load_saved_settings,
)


@dataclass(frozen=True)
class Recorded:
    """Where a recorded attempt lives: its ledger file and the settings its session ran with."""

    ledger: Path
    settings: Path | None  # None = the workdir's own settings.json
    document: LedgerDocument
    attempt: Attempt


def find_recorded(
    workdir: Path,
    run_id: str,
    session: str | None = None,
    note: Callable[[str], None] | None = None,
) -> Recorded:
    """A run id, or a pypto SHA (prefix; see `LedgerDocument.named`), looked up in the current
    session, then the earlier ones (run ids are unique across them), or only in `session`. A SHA
    that names several attempts (a re-tested boundary) takes the latest, and `note` says so."""
    current = ledger_path(workdir)
    if session is not None:
        ledgers = [(earlier_session(current, session), True)]
    else:
        earlier = reversed(list(earlier_sessions(current).values()))
        ledgers = [(current, False), *((path, True) for path in earlier)]
    for path, backup in ledgers:
        document = Ledger.read(path)
        named = document.named(run_id)
        if named:
            latest = named[-1]
            by_sha = latest.pypto_sha.startswith(run_id.lower()) and latest.run_id != run_id
            others = [
                a for a in document.attempts if a.pypto_sha == latest.pypto_sha and a is not latest
            ]
            if by_sha and others and note is not None:
                # A SHA names its pypto-level runs first (see `named`): runs of the other levels
                # may come after the one taken.
                if latest.level != "pypto" or len(named) == len(others) + 1:
                    which = "the latest"
                elif len(named) > 1:
                    which = "the latest of its own (the pypto level's verdicts)"
                else:
                    which = "its own (the pypto level's verdict)"
                listed = ", ".join(a.run_id for a in others[:5]) + (
                    ", …" if len(others) > 5 else ""
                )
                note(
                    f"pypto {latest.pypto_sha[:12]} has {len(others) + 1} recorded attempts; "
                    f"taking {which}, {latest.run_id} (name another by its run id: {listed})"
                )
            settings = session_copy(path, SETTINGS_NAME) if backup else None
            return Recorded(path, settings, document, latest)
    raise BadInput(f"no attempt {run_id!r} in {current} or its earlier sessions (see `status`)")


def compare_wheels(original: Attempt, again: Attempt) -> list[str]:
    """One line per package: whether a reproduction ran the wheel the verdict was made with.

    Builds take the commit's time as SOURCE_DATE_EPOCH, so a wheel rebuilt with the same tools is
    normally the same file; when it is not, its contents tell a timestamp from a real change."""
    lines = []
    for package in sorted(set(original.wheel_digests) & set(again.wheel_digests)):
        old, new = original.wheel_digests[package], again.wheel_digests[package]
        how = "rebuilt" if again.builds.get(package) == "built" else "from the wheel cache"
        if old == new:
            lines.append(f"{package} wheel: the recorded file ({how}, sha256 {new[:12]})")
            continue
        contents = original.wheel_contents.get(package)
        if contents is not None and contents == again.wheel_contents.get(package):
            lines.append(
                f"{package} wheel: {how}, the recorded files in another archive "
                f"(sha256 {old[:12]} -> {new[:12]}: timestamps or order only)"
            )
        else:
            lines.append(
                f"{package} wheel: {how}, and NOT the recorded one (sha256 {old[:12]} -> "
                f"{new[:12]}): the build did not reproduce, so a verdict change may come from it"
            )
    return lines


def reproduce(
    workdir: Path,
    run_id: str,
    echo: Callable[[str], None] | None = None,
    session: str | None = None,
    note: Callable[[str], None] | None = None,
    cache_dir: Path | None = None,
) -> tuple:
    """Run a recorded attempt again in a fresh container; returns (original, new attempt).

    The attempt is looked up in the current session, then in the earlier ones (run ids are
    unique across them), or only in ``session`` (`find_recorded`, which tells `note` which
    attempt a SHA took); it is rebuilt with its own session's settings, in `cache_dir` when
    given instead of the session's cache.
    """
    workdir = workdir.expanduser().resolve()
    if cache_dir is not None:  # (a typo would rebuild everything from cold, minutes of C++)
        existing_cache(cache_dir, "; for a check from cold, create an empty one")
    recorded = find_recorded(workdir, run_id, session, note)
    original = recorded.attempt
    if original.verdict is Verdict.SKIP and original.reason.startswith(USER_SKIP):
        raise BadInput(
            f"attempt {original.run_id} is a commit --skip took as untestable: it was never "
            "built or run, so there is nothing to reproduce"
        )
    settings = load_saved_settings(workdir, recorded.settings)
    inputs = recorded.document.inputs
    moved = {"cache_dir": cache_dir.expanduser().resolve()} if cache_dir is not None else {}
    settings = settings.model_copy(
        update={
            # Where the workdir is now: it may have moved since (its lib snapshot with it).
            "workdir": workdir,
            "pypto": inputs.checkout(),
            "lib": Path(inputs.lib_repo),
            "known_good": inputs.good,
            "bad": inputs.bad,
            **moved,
        }
    )
    prepared = session_prepared(settings, inputs.settings_digest, "reproduce")
    if prepared.base_image_id != inputs.base_image_id:
        raise BadInput(
            f"base image {inputs.base_image} is now {prepared.base_image_id[:19]}, not the "
            f"{inputs.base_image_id[:19]} the verdict was made with; load that image to reproduce"
        )
    repro_dir = workdir / "reproductions"
    if recorded.settings is not None:  # an earlier session's attempt
        repro_dir = session_folder(workdir, recorded.ledger) / "reproductions"
    repro_ledger = repro_dir / LEDGER_NAME
    # Reproductions of another session's inputs are kept as a backup, like --new-session does.
    other = repro_ledger.exists() and Ledger.read(repro_ledger).inputs != prepared.inputs
    with contextlib.ExitStack() as stack:
        ledger = stack.enter_context(
            Ledger.open(repro_ledger, prepared.inputs, tool_version=__version__, new_session=other)
        )
        wheels = None
        if original.verdict is Verdict.SKIP and original.reason.startswith("build failed"):
            # The verdict is the build itself: build again, not the cache's recorded failure.
            wheels = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=repro_dir)))
        tester = docker_tester(prepared, ledger, repro_dir, echo=echo, wheels=wheels)
        try:
            again = tester.test(original.level, original.pypto_sha, original.simpler_sha)
        finally:
            tester.close(cancel=True)
    # Both as the session's limits judge them, as its search did.
    limits = settings.tolerance()
    return judged(original, limits), judged(again, limits)


def session_prepared(settings: Settings, digest: str, action: str) -> Prepared:
    """The session's inputs prepared again, for `reproduce` and `export`, with the pypto-lib
    tree its runs read (`digest`: the session's recorded settings digest).

    The checkout as it is now, when it still gives the session's digest: the runs read its
    snapshot in the workdir, made again from it when the workdir lacks it (a CI artifact keeps
    the ledger and logs, not `lib-snapshot/`), and checked against the digest as `run` checks
    it. Else the workdir's own snapshot whose content gives the digest (the checkout moved on).
    """
    prepared = prepare(settings)
    workdir = settings.workdir
    if prepared.inputs.settings_digest == digest:
        snapshot(prepared.lib, prepared.lib_digest, workdir, prepared.lib_exclude)
        return prepared
    snapshots = workdir / SNAPSHOTS
    candidates = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    for candidate in candidates:
        with contextlib.suppress(BadInput):
            prepared = prepare(settings.model_copy(update={"lib": candidate}))
            if prepared.inputs.settings_digest == digest:
                return prepared
    raise BadInput(
        f"the pypto-lib checkout, pto-isa, ptoas or the run settings changed since the session "
        f"ran, and no snapshot in {snapshots} matches it; restore them, then {action}"
    )
