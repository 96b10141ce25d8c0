"""`status` and `report`: a session's picture rebuilt from its ledger alone, and its reports
written again, never starting a container.

The same `Session` that ran the bisect decides again over the recorded attempts, with a tester
that runs nothing (`LedgerOnly`): where the ledger ends, it says what `run` would test next.
`report --rethreshold` re-judges every recorded attempt with other limits the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.config import Settings
from runner.errors import BadInput, LedgerError
from runner.history import History
from runner.ledger import (
    Attempt,
    Ledger,
    LedgerDocument,
    Level,
    earlier_session,
    in_use,
    session_copy,
    session_folder,
)
from runner.prepare import extra_repos
from runner.report import RETHRESHOLD_DIR
from runner.search import Verdict
from runner.session import EndpointFailure, Outcome, Pending, Request
from runner.sources import SourceExporter
from runner.verdict import Tolerance
from runner.workflow import (
    SETTINGS_NAME,
    RunResult,
    endpoint_error,
    existing_cache,
    ledger_path,
    limit_notes,
    load_saved_settings,
    make_session,
    stopped_at_endpoint,
    write_outcome,
)


class LedgerOnly:
    """A tester that never runs anything: replay stops where the ledger ends, at the round the
    session's devices would run next."""

    def __init__(self, parallel: int = 1) -> None:
        self.parallel = parallel

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        raise Pending(level, pypto, simpler)

    def test_round(self, requests: Sequence[Request], done: object = None) -> list[Attempt]:
        first, *rest = requests
        pair = (first.pypto, first.simpler)
        also = [(r.pypto, r.simpler) for r in rest if (r.pypto, r.simpler) != pair]
        raise Pending(first.level, *pair, list(dict.fromkeys(also)))


@dataclass
class Replay:
    document: LedgerDocument
    outcome: Outcome
    history: History
    exporter: SourceExporter
    workdir: Path
    endpoint_failure: EndpointFailure | None = None


def replay(
    workdir: Path,
    cache_dir: Path | None = None,
    session: str | None = None,
    rethreshold: Tolerance | None = None,
) -> Replay:
    """Rebuild a session's picture from its ledger alone (for `status` and `report`).

    ``session`` names an earlier session of the workdir (a backup `--new-session` made).
    ``rethreshold`` re-judges every attempt from its recorded figures with these limits instead
    of the session's (an inactive Tolerance: the example's own PASS/FAIL).
    """
    workdir = workdir.expanduser().resolve()
    path = ledger_path(workdir)
    saved = None
    if session is not None:
        path = earlier_session(path, session)
        saved = session_copy(path, SETTINGS_NAME)
    document = Ledger.read(path)
    inputs = document.inputs
    settings = _settings_or_none(workdir, saved)
    if rethreshold is not None:
        settings = (settings or Settings()).model_copy(
            update={
                "max_mismatch_ratio": rethreshold.max_mismatch_ratio,
                "max_abs_diff": rethreshold.max_abs_diff,
                "max_rel_diff": rethreshold.max_rel_diff,
            }
        )
    if cache_dir is None:
        cache_dir = settings.cache_root() if settings is not None else Settings().cache_root()
    else:
        existing_cache(cache_dir)
    history = History(inputs.checkout())
    extra = extra_repos(settings) if settings is not None else {}
    exporter = SourceExporter(
        inputs.checkout(), cache_dir.resolve(), extra, runtime=inputs.submodule_path
    )
    document.check_range([inputs.good, *history.first_parent_range(inputs.good, inputs.bad)], path)
    tester = LedgerOnly(parallel=max(1, len(inputs.devices)))
    session = make_session(history, exporter, tester, document.find_all, inputs, settings)
    failure = None
    try:
        outcome = session.run()
    except EndpointFailure as exc:
        failure = exc
        commits = history.first_parent_range(inputs.good, inputs.bad)
        outcome = stopped_at_endpoint(inputs.good, commits, str(endpoint_error(exc)))
    judged = document.judged(session.tolerance)
    if failure is None:
        outcome.notes += limit_notes(judged, session.tolerance, in_force=rethreshold is None)
    return Replay(judged, outcome, history, exporter, workdir, failure)


def _settings_or_none(workdir: Path, path: Path | None = None) -> Settings | None:
    try:
        return load_saved_settings(workdir, path)
    except (BadInput, LedgerError):
        return None


def rewrite_reports(
    workdir: Path,
    cache_dir: Path | None = None,
    session: str | None = None,
    rethreshold: Tolerance | None = None,
    aside: Path | None = None,
) -> RunResult:
    """The reports again; an earlier session's go to sessions/<name>/, never over the current;
    while a run holds the workdir, to `aside` when given (else over the run's, which it
    rewrites when it ends)."""
    state = replay(workdir, cache_dir, session, rethreshold)
    state.outcome.running = session is None and in_use(ledger_path(state.workdir))
    if rethreshold is not None:
        state.outcome.rejudged = rethreshold.describe() or "the example PASS/FAIL"
        state.outcome.notes.append(
            f"re-judged from the recorded figures ({state.outcome.rejudged}); "
            "no container was started"
        )
        pending = state.outcome.pending
        if pending is not None:
            state.outcome.notes.append(
                f"these thresholds need tests the ledger lacks: `run` with them would test next "
                f"the {pending}"
            )
        bad = state.document.inputs.bad
        ends = [a for a in state.document.counted() if a.pypto_sha == bad and a.level == "pypto"]
        if ends and all(a.verdict is Verdict.GOOD for a in ends):
            # Each of its runs is within the limits: `run` would re-test it, then stop (exit 3).
            state.outcome.notes.append(
                f"under these thresholds the known-bad commit {bad[:12]} passes (all "
                f"{len(ends)} of its runs): they find no regression in this range"
            )
    out = state.workdir
    if session is not None:
        out = session_folder(out, earlier_session(ledger_path(out), session))
    # A what-if goes beside the session's reports, which stay as `run` left them. While a run
    # holds the workdir its reports are that run's to write (it writes them when it ends), so
    # these go to `aside`, where the caller shows them.
    reports = out / RETHRESHOLD_DIR if rethreshold is not None else None
    if state.outcome.running and reports is None:
        reports = aside
    return write_outcome(
        out, state.document, state.outcome, state.history, state.exporter, None, reports
    )
