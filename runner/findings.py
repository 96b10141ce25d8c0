"""The report's findings: what the culprits changed, which runs to compare, what triage says.

A report needs more than the ledger and the outcome: the commits' metadata, the culprit's stat
and patch (from git), the last-good and first-bad runs to compare, triage of their generated
code, and the command that reproduces the verdict. Gathering them is kept apart from the wiring
in `workflow.py`, so a change to what a report shows does not touch how a bisect is run.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from runner.errors import INFRASTRUCTURE_LOG, BadInput, SourceUnavailable
from runner.history import CommitInfo, History
from runner.ledger import Attempt, LedgerDocument, to_git_bisect_log
from runner.noop import identical_build
from runner.report import ReportFacts
from runner.search import Verdict
from runner.session import LevelResult, Outcome
from runner.sources import SourceExporter
from runner.triage import compare_generated

# A merge culprit's brought-in commits checked for a pointer move of their own (git runs two
# commands per commit; a merge of a long-lived branch can bring thousands).
MOVERS_LOOKED_AT = 200


def _artifacts(attempt: Attempt | None) -> Path | None:
    if attempt is None or attempt.artifacts_dir is None:
        return None
    return Path(attempt.artifacts_dir)


def _run_with(
    doc: LedgerDocument, pypto: str, simpler: str | None, verdict: Verdict
) -> Attempt | None:
    """The latest attempt of a pair with this verdict (a flaky pair has both), else the latest
    that ran the example (limits may judge a run otherwise than it ended), else the latest."""
    runs = doc.find_all(pypto, simpler)
    ran = [a for a in runs if a.verdict is not Verdict.SKIP] or runs
    return next((a for a in reversed(runs) if a.verdict is verdict), ran[-1] if ran else None)


def _last_good_run(
    doc: LedgerDocument, level: LevelResult, history: History, path: str
) -> Attempt | None:
    """The run of the level's last good commit, or of the commit before it when that one could
    not be tested (a stretch of untestable bumps before the culprit): the run the answer's
    boundary rests on."""
    for sha in reversed(level.candidates[: level.bounds[0] + 1]):
        pinned = history.gitlink(sha, path)
        if any(a.verdict is not Verdict.SKIP for a in doc.find_all(sha, pinned)):
            return _run_with(doc, sha, pinned, Verdict.GOOD)
    return None


def passed_parent(
    states: list[str], found: int, blamed: str, parents: Callable[[str], list[str]]
) -> str | None:
    """The merged parent (not the first) through which the search's path passed the blamed
    merge, or None: against it the merge brings the first parent's line. Going forward the
    parent is the state before the merge; going backward (the merge's removal blamed, the
    state before the first bad one), the first bad state."""
    beside = states[found - 1] if blamed == states[found] else states[found]
    return beside if beside in parents(blamed)[1:] else None


def _crossing(
    simpler: History, moves: Mapping[str, tuple[str | None, str | None]], culprit: str
) -> str | None:
    """Which of the commits a pypto merge brings moved the pointer across the simpler culprit
    (`moves`: each one's old and new pointer): its old pointer holds that commit and its new
    one does not, or the other way round."""

    def holds(pointer: str | None) -> bool:
        return pointer is not None and simpler.holds(pointer, culprit)

    for sha, (old, new) in moves.items():
        if holds(old) != holds(new):
            return sha
    return None


def gather_facts(
    doc: LedgerDocument,
    outcome: Outcome,
    history: History,
    exporter: SourceExporter,
    workdir: Path,
    wall_s: float | None,
) -> ReportFacts:
    # The session's wall time counts every invocation; wall_s is this one's (None: no run).
    session_s = doc.wall_s if doc.wall_s is not None else wall_s
    facts = ReportFacts(wall_s=session_s, invocation_s=wall_s)
    commits: dict[str, CommitInfo] = {}
    for sha in {doc.inputs.good, doc.inputs.bad, *outcome.pypto.suspects}:
        commits[sha] = history.commit_info(sha)
    culprit = outcome.pypto.first_bad
    if culprit is not None:
        facts.culprit_stat = history.stat(culprit)
        facts.culprit_patch = history.patch(culprit)
        facts.merged = history.merged(culprit)
    path = doc.inputs.submodule_path
    if culprit is not None:
        moves = history.submodule_moves(culprit)
        facts.pypto_submodules = [move for move in moves if move[0] != path]
    moves: dict[str, tuple[str | None, str | None]] = {}  # each pointer mover's old and new
    if facts.merged is not None and outcome.source == "simpler":
        # Which of the commits a merge culprit brings moved the runtime pointer themselves: the
        # report lists them when that move carries the regression (else what the merge brings).
        for sha, subject in facts.merged.commits[:MOVERS_LOOKED_AT]:
            parent = history.parent(sha)
            before = history.gitlink(parent, path) if parent is not None else None
            after = history.gitlink(sha, path)
            if after != before:
                facts.pointer_movers.append((sha, subject))
                moves[sha] = (before, after)
    good_run = bad_run = None
    if outcome.pypto.found is not None:
        good_run = _last_good_run(doc, outcome.pypto, history, path)
        bad_run = _run_with(doc, culprit, history.gitlink(culprit, path), Verdict.BAD)
    simpler = outcome.simpler
    if simpler is not None and simpler.found is not None:
        blamed = outcome.simpler_culprit
        try:
            sub = History(exporter.submodule_git_dir(path))
            for sha in {blamed, simpler.first_bad}:
                if sha is not None:
                    commits[sha] = sub.commit_info(sha)
            if blamed is not None:
                since = passed_parent(simpler.candidates, simpler.found, blamed, sub.parents)
                facts.simpler_stat = sub.stat(blamed, since)
                facts.simpler_submodules = sub.submodule_moves(blamed, since)
                facts.simpler_patch = sub.patch(blamed, since)
                merged = sub.merged(blamed, since)
                # Its branch is simpler's: no --good/--bad of this tool's can bisect it.
                facts.simpler_merged = None if merged is None else replace(merged, branch=None)
                facts.crossing_mover = _crossing(sub, moves, blamed)
        except (SourceUnavailable, BadInput):
            pass
        good_state = simpler.candidates[simpler.found - 1]
        good_run = _run_with(doc, simpler.anchor, good_state, Verdict.GOOD) or good_run
        bad_run = _run_with(doc, simpler.anchor, simpler.first_bad, Verdict.BAD) or bad_run
    facts.commits = commits
    if outcome.pypto.found is not None:
        same = (
            good_run is not None and bad_run is not None and good_run.pypto_sha == bad_run.pypto_sha
        )
        facts.triage = compare_generated(
            _artifacts(good_run),
            _artifacts(bad_run),
            same_compiler=same,
            same_runtime=good_run is not None
            and bad_run is not None
            and good_run.simpler_sha == bad_run.simpler_sha,
        )
        package = "simpler" if simpler is not None and simpler.found is not None else "pypto"
        if identical_build(bad_run, good_run, package, facts.triage.status):
            facts.noop = package
    if bad_run is not None:
        facts.reproduce = (
            f"bisect-precision-docker reproduce --workdir {shlex.quote(str(workdir))} "
            f"{bad_run.run_id}"
        )
    # Every tested pypto commit: the first level's table counts its runs from any stage.
    subjects = history.subjects({a.pypto_sha for a in doc.attempts})
    if simpler is not None:
        # The bump's ends are judged with the pypto level's and the split's runs too.
        tested = {a.simpler_sha for a in doc.attempts if a.simpler_sha} | set(simpler.suspects)
        with contextlib.suppress(SourceUnavailable, BadInput):
            subjects.update(History(exporter.submodule_git_dir(path)).subjects(tested))
    subjects.update({sha: info.subject for sha, info in commits.items()})
    facts.subjects = subjects
    facts.infrastructure, facts.earlier_infrastructure = infrastructure_faults(
        workdir / INFRASTRUCTURE_LOG, doc
    )
    facts.bisect_log = bisect_log(doc, history, subjects, culprit)
    return facts


def bisect_log(
    doc: LedgerDocument,
    history: History,
    subjects: Mapping[str, str],
    boundary: str | None = None,
) -> str:
    """The session's first level as a `git bisect log`, each tested commit's runs at its own
    runtime pointer counted whichever stage recorded them, marked by their side of `boundary`
    (the session's first bad commit) where given or where flaky runs contradict the order."""
    path = doc.inputs.submodule_path
    pins = {sha: history.gitlink(sha, path) for sha in {a.pypto_sha for a in doc.attempts}}
    order: list[str] | None = None
    with contextlib.suppress(BadInput):
        order = [doc.inputs.good, *history.first_parent_range(doc.inputs.good, doc.inputs.bad)]
    return to_git_bisect_log(doc, subjects, pins=pins, order=order, boundary=boundary)


def infrastructure_faults(log: Path, doc: LedgerDocument) -> tuple[list[str], list[str]]:
    """The session's lines of the infrastructure log, and those of them an earlier `run` of it
    wrote (before its last invocation, which is the run now ending or the one a report shows):
    a card an earlier run took out of the pool may be back in this one's."""
    lines = _infrastructure_faults(log, doc.created_at)
    if len(doc.invocations) < 2:
        return lines, []
    latest = set(_infrastructure_faults(log, doc.invocations[-1].started_at))
    return lines, [line for line in lines if line not in latest]


def _infrastructure_faults(log: Path, since: datetime) -> list[str]:
    """This session's lines of the infrastructure log: faults retried (never verdicts) and
    devices taken out of the pool, as "<time> <pypto> <simpler> <reason>"."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    kept = []
    for line in lines:
        stamp, _, rest = line.partition(" ")
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            continue
        if when >= since:
            kept.append(rest)
    return kept
