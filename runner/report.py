"""The paste-ready report: `report.json` for machines, `report.md` for people.

Everything here is computed from the ledger, the session's outcome and a few facts about commits
gathered by the caller, so `report` can rewrite both files at any time without running anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.confidence import consistent, tally, why_low
from runner.errors import RETIRED, USER_SKIP
from runner.files import write_text_atomic
from runner.fingerprint import changes as fingerprint_changes
from runner.fingerprint import describe as describe_change
from runner.history import Change, CommitInfo, Merged
from runner.ledger import LOCAL_NODE, Attempt, LedgerDocument, placement
from runner.plots import Point, plot, present, series
from runner.search import Verdict
from runner.session import LevelResult, Outcome, describe_split
from runner.triage import Triage
from runner.wording import counted

REPORT_SCHEMA_VERSION = 1
INTERESTING = re.compile(
    r"dtype|cast|precision|round|layout|fp16|bf16|fp32|float|half|tolerance|rtol|atol|"
    r"\bpass(es)?\b|optimi[sz]|fuse|fusion|accumulat|scale",
    re.IGNORECASE,
)
MAX_HUNK_LINES = 200
MERGED_SHOWN = 20  # a merge culprit's commits listed in report.md (report.json has all)
PLOT_NAME = "metrics.png"
# What `write_reports` leaves in a folder (the plot's digest marks it as drawn).
REPORT_FILES = ("report.json", "report.md", PLOT_NAME, PLOT_NAME + ".sha256")
RETHRESHOLD_DIR = "rethreshold"
"""`report --rethreshold` writes its reports here, inside the session's folder."""


@dataclass
class ReportFacts:
    """What the report needs beyond the ledger and the outcome, gathered from git by the caller."""

    commits: Mapping[str, CommitInfo] = field(default_factory=dict)  # pypto and simpler commits
    subjects: Mapping[str, str] = field(default_factory=dict)  # every tested commit's subject
    infrastructure: list[str] = field(default_factory=list)  # this session's infrastructure log
    # Of those, the lines an earlier `run` of the session wrote (a card it retired may be back).
    earlier_infrastructure: list[str] = field(default_factory=list)
    culprit_stat: str = ""
    culprit_patch: str = ""
    simpler_stat: str = ""
    simpler_patch: str = ""
    triage: Triage | None = None
    reproduce: str = ""
    bisect_log: str = ""
    wall_s: float | None = None  # the session's, over every invocation
    invocation_s: float | None = None  # this invocation's; None when no bisect ran (`report`)
    plot: str = ""  # the figures' PNG, relative to the report
    noop: str = ""  # "pypto"/"simpler": the culprit's build equals its parent's
    merged: Merged | None = None  # what the pypto culprit brings in, when it is a merge
    simpler_merged: Merged | None = None  # likewise the simpler culprit (no branch to bisect)
    # The commits a pypto merge culprit brings that moved the runtime pointer themselves.
    pointer_movers: list[tuple[str, str]] = field(default_factory=list)
    crossing_mover: str | None = None  # the one of them whose move crosses the simpler culprit
    # The submodule pointers of simpler's own that its culprit moves: (path, old, new).
    simpler_submodules: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    # Likewise the pypto culprit's, the runtime's aside (its move is the change's).
    pypto_submodules: list[tuple[str, str | None, str | None]] = field(default_factory=list)


def interesting_hunks(patch: str, limit: int = MAX_HUNK_LINES) -> str:
    """Diff hunks that touch dtype, cast, precision, rounding, layout or optimisation passes."""
    kept: list[str] = []
    header: list[str] = []
    hunk: list[str] = []
    path = ""

    def flush() -> None:
        if not hunk:
            return
        changed = "\n".join(line for line in hunk[1:] if line[:1] in "+-")
        if INTERESTING.search(changed) or INTERESTING.search(path):
            if header:
                kept.extend(header)
                header.clear()
            kept.extend(hunk)
        hunk.clear()

    for line in patch.splitlines():
        if line.startswith("diff --git"):
            flush()
            header = [line]
            path = line.split(" b/", 1)[-1]
        elif line.startswith(("--- ", "+++ ")) and not hunk:
            header.append(line)
        elif line.startswith("@@"):
            flush()
            hunk.append(line)
        elif hunk:
            hunk.append(line)
    flush()
    if len(kept) > limit:
        kept = [*kept[:limit], f"... ({len(kept) - limit} more lines cut)"]
    return "\n".join(kept)


def _stats(
    doc: LedgerDocument, wall_s: float | None, invocation_s: float | None = None
) -> dict[str, Any]:
    builds = {"pypto": 0, "simpler": 0}
    hits = 0
    ccache = {"hits": 0, "misses": 0}
    for attempt in doc.attempts:
        for package, state in attempt.builds.items():
            if state in ("built", "failed"):
                builds[package] = builds.get(package, 0) + 1
            elif state in ("cached", "failed-cached"):
                hits += 1
        for counts in attempt.ccache.values():
            ccache["hits"] += counts[0]
            ccache["misses"] += counts[1]
    ahead = {"pypto": 0, "simpler": 0}
    for build in doc.ahead:
        builds[build.package] = builds.get(build.package, 0) + 1
        ahead[build.package] = ahead.get(build.package, 0) + 1
        if len(build.ccache) == 2:
            ccache["hits"] += build.ccache[0]
            ccache["misses"] += build.ccache[1]
    compiled = ccache["hits"] + ccache["misses"]
    if wall_s is None:
        wall_s = sum((a.finished_at - a.started_at).total_seconds() for a in doc.attempts)
    return {
        "tests": len(doc.attempts),
        "rounds": len({a.round for a in doc.attempts if a.round is not None}) or len(doc.attempts),
        "builds": builds,
        "builds_ahead": ahead,
        "cache_hits": hits,
        "ccache": {**ccache, "hit_rate": round(ccache["hits"] / compiled, 3) if compiled else None},
        "export_s": round(sum(a.export_s for a in doc.attempts), 2),
        "wall_s": round(wall_s, 2),
        "invocation_s": round(invocation_s, 2) if invocation_s is not None else None,
    }


def _commit(facts: ReportFacts, sha: str | None) -> dict[str, Any] | None:
    if sha is None:
        return None
    info = facts.commits.get(sha)
    if info is None:
        return {"sha": sha}
    return {
        "sha": info.sha,
        "subject": info.subject,
        "author": info.author,
        "date": info.date,
    }


def _merge_culprit(outcome: Outcome, facts: ReportFacts) -> Merged | None:
    """What a merge culprit brings in, unless the simpler pointer it moves carries the
    regression: then its other commits are beside the point."""
    return facts.merged if outcome.source != "simpler" else None


def _merged(merged: Merged | None) -> dict[str, Any] | None:
    if merged is None:
        return None
    branch = merged.branch
    return {
        "commits": [{"sha": sha, "subject": subject} for sha, subject in merged.commits],
        "branch": {"good": branch[0], "bad": branch[1]} if branch is not None else None,
    }


def _merge_note(merged: Merged | None) -> str:
    """The headline's word on a merge culprit (nothing for another commit)."""
    if merged is None:
        return ""
    return f", a merge of {counted(len(merged.commits), 'commit')} listed below"


def _merge_block(merged: Merged, removed: bool = False) -> list[str]:
    """A merge culprit's commits: the bisect never looks inside them. `removed`: a backward
    pointer move blamed the merge's removal, so the regression came with dropping them."""
    commits = merged.commits
    how = "with the removal of" if removed else "in with"
    lines = [
        f"It is a merge: the regression came {how} one of the "
        f"{counted(len(commits), 'commit')} it brings (newest first) or with the merge's own "
        "resolution; the bisect does not look inside a merge.",
        "",
    ]
    lines += [f"- `{sha[:12]}` {subject}".rstrip() for sha, subject in commits[:MERGED_SHOWN]]
    if len(commits) > MERGED_SHOWN:
        lines.append(f"- … and {len(commits) - MERGED_SHOWN} more")
    if merged.branch is not None:
        good, bad = merged.branch
        lines += [
            "",
            f"To find which, bisect the merged branch: `run --good {good[:12]} --bad {bad[:12]}` "
            "with this run's other options (when the branch alone shows the regression).",
        ]
    return [*lines, ""]


def _movers_block(
    merged: Merged, movers: list[tuple[str, str]], crossing: str | None = None
) -> list[str]:
    """A merge culprit whose pointer move carries the regression: which of the commits it
    brings moved the pointer (the merge's own move is theirs), and which of them crossed the
    simpler culprit when the report can tell."""
    listed = ", ".join(f"`{sha[:12]}` {subject}".rstrip() for sha, subject in movers[:3])
    more = f" and {len(movers) - 3} more" if len(movers) > 3 else ""
    lines = [
        f"It is a merge of {counted(len(merged.commits), 'commit')}; the pointer move came in "
        f"with {listed}{more}.",
    ]
    if crossing is not None and len(movers) > 1:
        lines[0] += f" Of them, `{crossing[:12]}` moved it across the simpler commit below."
    if merged.branch is not None:
        good, bad = merged.branch
        lines.append(
            f"Its branch can be bisected on its own: `run --good {good[:12]} --bad {bad[:12]}` "
            "with this run's other options."
        )
    return [*lines, ""]


def _subjects(facts: ReportFacts, shas: list[str]) -> dict[str, str]:
    """The subjects of the commits the report knows, by SHA (for a summary's candidates)."""
    known = {sha: info.subject for sha, info in facts.commits.items()}
    return {sha: known.get(sha) or facts.subjects.get(sha, "") for sha in shas}


def _change(change: Change | None) -> dict[str, Any] | None:
    if change is None:
        return None
    return {
        "kind": change.kind,
        "old": change.old,
        "new": change.new,
        "changed_paths": list(change.changed_paths),
    }


def _verdict_cell(step: Mapping[str, Any]) -> str:
    """A superseded skip stays in the table, marked: its pair was tested again."""
    return f"{step['verdict']} (superseded)" if step.get("superseded") else str(step["verdict"])


def _step(attempt: Attempt) -> dict[str, Any]:
    return {
        "run_id": attempt.run_id,
        "level": attempt.level,
        "pypto": attempt.pypto_sha,
        "simpler": attempt.simpler_sha,
        "verdict": attempt.verdict.value,
        "reason": attempt.reason,
        "exit_code": attempt.exit_code,
        "build_s": round(attempt.build_s, 2),
        "run_s": round(attempt.run_s, 2),
        "round": attempt.round,
        "device": attempt.device,
        "node": attempt.node,
        "builds": dict(attempt.builds),
        "build_tools": {k: list(v) for k, v in attempt.build_tools.items()},
        "builders": dict(attempt.builders),
        "ccache": {k: list(v) for k, v in attempt.ccache.items()},
        "export_s": round(attempt.export_s, 2),
        "from_cache": bool(attempt.builds)
        and all(state.endswith("cached") for state in attempt.builds.values()),
        "metrics": dict(attempt.metrics),
        "log": attempt.log_path,
    }


def _devices(doc: LedgerDocument) -> str:
    """The cards the session ran on: --device's, or where a cluster placed the runs."""
    placed = sorted(
        {
            placement(a.device, a.node)
            for a in doc.attempts
            if a.device and a.node not in (None, LOCAL_NODE)
        }
    )
    if placed:
        return f"device{'s' if len(placed) > 1 else ''} {', '.join(placed)} (placed by Ray)"
    now = doc.inputs.devices
    # (a test on several cards, --cards-per-test, records them as "0,1")
    earlier = [
        d
        for d in dict.fromkeys(a.device for a in doc.attempts if a.device)
        if not set(d.split(",")) <= set(now)
    ]
    if earlier:  # a resumed session may run on other cards than its first runs did
        return f"device {','.join(now)} (earlier runs also on {', '.join(earlier)})"
    return f"device {','.join(now)}"


def _where(step: dict[str, Any]) -> str:
    """The device that ran the example, and the node when not this host."""
    device = step.get("device") or ""
    return placement(device, step.get("node")) if device else ""


def _confidence(outcome: Outcome, level: LevelResult | None) -> dict[str, Any] | None:
    """How sure a level is: per tested commit its pass/fail counts, the culprit's probability
    and the runner-up, the estimated flake rates, and the candidates when it stayed unsure (the
    commits they blame: `Outcome.blamed`)."""
    if level is None:
        return None
    tested = []
    for index in sorted({*level.observations, *level.checks}):
        checked = level.checks.get(index)
        tested.append(
            {
                "sha": level.candidates[index],
                "index": index,
                **_counts(level.observations.get(index, [])),
                # the drift check's runs at the end, which the search did not weigh
                "drift_check": None if checked is None else _counts(checked),
            }
        )
    data: dict[str, Any] = {
        "mode": "confidence" if level.repeat is None else f"repeat {level.repeat} {level.policy}",
        "probability": level.probability,
        "likeliest": None,  # with no culprit named
        "runner_up": None,
        "false_fail": None,
        "false_pass": None,
        "tested": tested,
        "low_confidence": None,
    }
    ranked = level.belief.ranked(mass=1.0, limit=1) if level.belief is not None else ()
    if level.found is None and ranked:
        # No culprit named: the runner-up is second to this one, which is said first.
        (top, p), *_ = ranked
        data["likeliest"] = {"sha": outcome.blamed(level, top), "probability": p}
    runner_up = level.runner_up
    if runner_up is not None:
        data["runner_up"] = {
            "sha": outcome.blamed(level, runner_up[0]),
            "probability": runner_up[1],
        }
    if level.belief is not None:
        data["false_fail"] = level.belief.false_fail
        data["false_pass"] = level.belief.false_pass
    # Rates learnt from nothing that disagreed are the prior's guess, not a measurement.
    evidence = level.prior.evidence if level.prior is not None else (0, 0, 0, 0)
    if level.belief is not None:  # a level judged with the other's runs: the chain's
        agree = level.belief.consistent
    else:
        agree = consistent(tally(level.observations))
    data["rates_from_prior"] = agree and evidence[0] == evidence[2] == 0
    if level.low_confidence is not None:
        data["low_confidence"] = [
            {"sha": outcome.blamed(level, i), "probability": p} for i, p in level.low_confidence
        ]
    return data


def _counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    return {
        "passes": verdicts.count(Verdict.GOOD),
        "fails": verdicts.count(Verdict.BAD),
        "skips": verdicts.count(Verdict.SKIP),
    }


def _mixed(level: LevelResult) -> list[int]:
    """The tested commits whose runs gave both verdicts, the drift check's at the end too."""
    mixed = []
    for i in sorted({*level.observations, *level.checks}):
        seen = {*level.observations.get(i, ()), *level.checks.get(i, ())}
        if Verdict.GOOD in seen and Verdict.BAD in seen:
            mixed.append(i)
    return mixed


def _disagreement_notes(outcome: Outcome) -> list[str]:
    """Fixed repeats judge each commit by their policy alone: say where its runs disagreed."""
    notes = []
    for level in (outcome.pypto, outcome.simpler):
        if level is None or level.repeat is None or not (mixed := _mixed(level)):
            continue
        listed = ", ".join(level.candidates[i][:12] for i in mixed)
        how = (
            "judged each bad, so a good commit failing by chance moves the culprit earlier"
            if level.policy == "any-fail"
            else "took each one's majority, a tie as bad"
        )
        notes.append(
            f"the example is flaky: runs of {len(mixed)} {level.level} "
            f"commit{'s' if len(mixed) > 1 else ''} ({listed}) disagreed, and --policy "
            f"{level.policy} {how}; the default confidence search weighs every run instead"
        )
    return notes


def _confidence_lines(data: dict[str, Any], subjects: Mapping[str, str]) -> list[str]:
    lines: list[str] = []
    for name in ("pypto", "simpler"):
        level = data.get(name)
        if not level:
            continue
        lines += [f"### {name} level ({level['mode']})", ""]
        if level["probability"] is not None:
            lines.append(f"- culprit probability: {level['probability']:.1%}")
        elif level.get("likeliest"):
            top = level["likeliest"]
            lines.append(
                f"- likeliest (no culprit named): `{top['sha'][:12]}` {top['probability']:.1%}"
            )
        if level["runner_up"]:
            up = level["runner_up"]
            lines.append(f"- runner-up: `{up['sha'][:12]}` {up['probability']:.1%}")
        if level["false_fail"] is not None:
            guess = (
                " (no run disagreed with another: mostly the prior's guess, not a measurement)"
                if level["rates_from_prior"]
                else ""
            )
            lines.append(
                f"- estimated flake rates: false fail {level['false_fail']:.1%}, "
                f"false pass {level['false_pass']:.1%}{guess}"
            )
        if level["low_confidence"]:
            listed = ", ".join(
                f"`{c['sha'][:12]}` {c['probability']:.1%}" for c in level["low_confidence"]
            )
            lines.append(f"- inconclusive: low confidence; candidates: {listed}")
        checked = any(row.get("drift_check") for row in level["tested"])
        head = "| commit | subject | passes | fails | skips |" + (" drift check |" * checked)
        lines += ["", head, "|---" * (5 + checked) + "|"]
        for row in level["tested"]:
            subject = subjects.get(row["sha"], "").replace("|", "\\|")[:60]
            line = (
                f"| `{row['sha'][:12]}` | {subject} | {row['passes']} | {row['fails']} | "
                f"{row['skips']} |"
            )
            if checked:
                line += f" {_checked(row.get('drift_check'))} |"
            lines.append(line)
        lines.append("")
    return lines


def _checked(runs: Mapping[str, int] | None) -> str:
    """A drift check's runs of a commit at the end, for its row of the table."""
    if not runs:
        return ""
    counts = [(runs["passes"], "passed"), (runs["fails"], "failed"), (runs["skips"], "skipped")]
    return ", ".join(f"{n} {word}" for n, word in counts if n)


def _levels(doc: LedgerDocument, outcome: Outcome) -> list[tuple[str, list[Point], int | None]]:
    """Each level's figures along its candidates, with the culprit's position."""
    out = []
    runs = doc.counted()
    pypto_runs = [a for a in runs if a.level == "pypto"]
    out.append(("pypto", series(pypto_runs, outcome.pypto.candidates), outcome.pypto.found))
    level = outcome.simpler
    if level is not None:  # its states' runs are those its model counted, whatever their level
        # Going backward the culprit is the state before the first bad one: the commit whose
        # removal brought the regression back.
        culprit = level.found
        if culprit is not None:
            culprit = level.candidates.index(outcome.blamed(level, culprit))
        out.append(("simpler", series(runs, level.candidates, level.runs), culprit))
    return out


def _figures(doc: LedgerDocument, outcome: Outcome, facts: ReportFacts) -> dict[str, Any]:
    data: dict[str, Any] = {"plot": facts.plot or None}
    for name, points, _ in _levels(doc, outcome):
        data[name] = [
            {"index": p.index, "sha": p.sha, "verdicts": p.verdicts, "values": p.values}
            for p in points
        ]
    return data


def _figure_lines(doc: LedgerDocument, outcome: Outcome, facts: ReportFacts) -> list[str]:
    lines: list[str] = []
    for name, points, culprit in _levels(doc, outcome):
        names = present(points)
        if not names:
            continue
        lines += [
            f"### {name} level",
            "",
            "| order | commit | runs | " + " | ".join(names) + " |",
            "|---|---|---|" + "---|" * len(names),
        ]
        for p in points:
            cells = []
            for figure in names:
                values = p.values.get(figure, [])
                cells.append(f"{sum(values) / len(values):.4g}" if values else "")
            mark = " **culprit**" if p.index == culprit else ""
            runs = ", ".join(p.verdicts)
            lines.append(
                f"| {p.index}{mark} | `{p.sha[:12]}` | {runs} | " + " | ".join(cells) + " |"
            )
        lines.append("")
    if not lines:
        return []
    head = ["## Precision figures along the tested commits", ""]
    head += ["Means over each commit's runs; a pass without figures counts as 0.", ""]
    if facts.plot:
        lines += [f"![precision figures against commit order]({facts.plot})", ""]
    return head + lines


def _environment(doc: LedgerDocument) -> dict[str, Any]:
    """The latest fingerprint, and every change of it with the attempts on each side."""
    latest = next((a.fingerprint for a in reversed(doc.attempts) if a.fingerprint), {})
    return {
        "latest": dict(latest),
        "changes": [
            {
                "key": change.key,
                "old": change.old,
                "new": change.new,
                "last_run_before": change.before,
                "first_run_after": change.after,
                "summary": describe_change(change),
            }
            for change in fingerprint_changes(doc.attempts)
        ],
    }


# Keys whose value is not what their name suggests at first sight (report.json keeps the keys).
_FINGERPRINT_NAMES = {
    "base_image_id": "base image the tests run on (id)",
    "base_image_tag": "image the base image tag names now (id)",
}


def _environment_lines(data: dict[str, Any]) -> list[str]:
    if not data["latest"] and not data["changes"]:
        return []
    lines = ["## Environment", ""]
    for change in data["changes"]:
        lines.append(f"> warning: {change['summary']}")
    if data["changes"]:
        lines.append("")
    else:
        lines += ["No change of the environment fingerprint during the session.", ""]
    lines += ["| fingerprint | latest value |", "|---|---|"]
    for key, value in data["latest"].items():
        name = _FINGERPRINT_NAMES.get(key, key)
        lines.append(f"| {name} | `{str(value).replace('|', '/')[:100]}` |")
    return [*lines, ""]


def _untested_notes(doc: LedgerDocument, outcome: Outcome) -> list[str]:
    """Why the candidates left over were skipped: the one thing to fix before running again."""
    runs_counted = doc.counted()
    suspects: dict[str, set[str | None]] = {}
    if outcome.pypto.found is None:
        suspects["pypto"] = set(outcome.pypto.suspects)
    else:
        # A bump blamed for the simpler commit its move brings, though its own build failed.
        blamed = outcome.pypto.candidates[outcome.pypto.found]
        runs = [a for a in runs_counted if a.level == "pypto" and a.pypto_sha == blamed]
        if runs and all(a.verdict is Verdict.SKIP for a in runs):
            suspects["pypto"] = {blamed}
    if outcome.simpler is not None and outcome.simpler.found is None:
        suspects["simpler"] = set(outcome.simpler.suspects)
    reasons: dict[str, dict[str, set[str]]] = {}
    logs: dict[str, str] = {}  # reason -> the log of its latest attempt
    for attempt in runs_counted:
        if attempt.verdict is not Verdict.SKIP:
            continue
        tested = attempt.pypto_sha if attempt.level == "pypto" else attempt.simpler_sha
        if tested in suspects.get(attempt.level, ()):
            reason = attempt.reason or "no reason recorded"
            # (the user's skips are one reason, whichever commit each names)
            reason = USER_SKIP if reason.startswith(USER_SKIP) else reason
            reasons.setdefault(reason, {}).setdefault(attempt.level, set()).add(str(tested))
            if attempt.log_path:
                logs[reason] = attempt.log_path
    ranked = sorted(reasons.items(), key=lambda item: -sum(map(len, item[1].values())))
    notes = []
    for reason, levels in ranked[:3]:
        counts = " and ".join(f"{len(levels[level])} {level}" for level in sorted(levels))
        plural = "s" if sum(map(len, levels.values())) > 1 else ""
        log = f" (log: {logs[reason]})" if reason in logs else ""
        said = reason
        if reason == USER_SKIP:
            said += f" ({', '.join(sorted(sha[:12] for shas in levels.values() for sha in shas))})"
        notes.append(f"{counts} candidate{plural} could not be tested: {said}{log}")
    if len(ranked) > 3:  # the three commonest say what to fix first; the rest are counted
        rest = sum(len(shas) for _, levels in ranked[3:] for shas in levels.values())
        notes.append(
            f"{counted(rest, 'more candidate')} could not be tested for "
            f"{counted(len(ranked) - 3, 'other reason')} (the Steps table has each)"
        )
    return notes


def _retirements(lines: list[str]) -> list[str]:
    """The infrastructure log's cards taken out of the pool, as "<device>: <reason>"."""
    return [line.split(RETIRED, 1)[1].strip() for line in lines if RETIRED in line]


def _check_notes(doc: LedgerDocument, facts: ReportFacts, outcome: Outcome) -> list[str]:
    notes = []
    retired = _retirements(facts.infrastructure)
    faults = len(facts.infrastructure) - len(retired)
    if faults:
        notes.append(
            f"{counted(faults, 'infrastructure fault')} (timeouts, OOM kills, device or Docker "
            f"errors) {'were' if faults > 1 else 'was'} retried and never counted as verdicts; "
            "see infrastructure.log in the workdir"
        )
    earlier = set(_retirements(facts.earlier_infrastructure))
    since = doc.invocations[-1].started_at if doc.invocations else None
    for entry in retired:  # "<device>: <reason>"
        device, _, reason = entry.partition(": ")
        when = ""
        if entry in earlier:
            back = since is not None and any(
                a.device is not None
                and placement(a.device, a.node) == device
                and a.started_at >= since
                for a in doc.attempts
            )
            when = " by an earlier run of the session" + (
                ", and was back in the pool for the latest run" if back else ""
            )
        notes.append(f"device {device} was taken out of the pool{when}: {reason}")
    culprit = outcome.pypto.first_bad
    if culprit == doc.inputs.bad and not any(a.pypto_sha == culprit for a in doc.attempts):
        notes.append(
            f"the culprit is the known-bad commit {culprit[:12]}, taken as bad without a run "
            "(--no-verify): every commit before it passed, so run it before trusting this"
        )
    if facts.noop:
        notes.append(
            f"the culprit's build is identical to its parent's (the same files in the "
            f"{facts.noop} wheel and the same generated code): flakiness or the environment is "
            "the likelier cause of the verdict change; run `reproduce` on both"
        )
    notes += _disagreement_notes(outcome)
    if outcome.drift:
        notes.append(
            "the environment drifted during the session: re-run in their recorded "
            f"images, {' and '.join(outcome.drift)} now {_fail(outcome.drift)}; the culprit is "
            "not trusted"
        )
    return notes


def _fail(drift: Sequence[str]) -> str:
    return "fails" if len(drift) == 1 else "fail"


def build_json(doc: LedgerDocument, outcome: Outcome, facts: ReportFacts) -> dict[str, Any]:
    superseded = set(doc.superseded)
    pypto = outcome.pypto
    simpler = outcome.simpler
    pre_submodule = outcome.change is not None and outcome.change.new is None
    data: dict[str, Any] = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "source": outcome.source,
        "finished": outcome.finished,
        # What `run` exits with once it has finished; none before.
        "exit_code": outcome.exit_code if outcome.finished else None,
        "inputs": doc.inputs.model_dump(mode="json"),
        "pypto": {
            "first_bad": pypto.first_bad,
            "last_good": pypto.last_good,
            "candidates": pypto.suspects,
            "candidate_subjects": _subjects(facts, pypto.suspects),
            "commit": _commit(facts, pypto.first_bad),
            "change": _change(outcome.change),
            "pre_submodule": pre_submodule,
            "merged": _merged(_merge_culprit(outcome, facts)),
            "submodules": [
                {"path": path, "old": old, "new": new} for path, old, new in facts.pypto_submodules
            ],
        },
        "split": None,
        "simpler": None,
        "triage": None,
        "notes": list(outcome.notes)
        + _untested_notes(doc, outcome)
        + _check_notes(doc, facts, outcome),
        "noop": facts.noop or None,
        "drift": list(outcome.drift),
        "figures": _figures(doc, outcome, facts),
        "environment": _environment(doc),
        "confidence": {
            "threshold": outcome.confidence,
            "pypto": _confidence(outcome, pypto),
            "simpler": _confidence(outcome, simpler),
        },
        "steps": [{**_step(a), "superseded": a.run_id in superseded} for a in doc.attempts],
        "stats": _stats(doc, facts.wall_s, facts.invocation_s),
        "reproduce": facts.reproduce,
    }
    if outcome.split is not None:
        data["split"] = {
            "pointer_half": outcome.split.pointer_half.value,
            "code_half": outcome.split.code_half.value,
            "carrier": outcome.split.carrier,
            "summary": describe_split(outcome.split),
        }
    if simpler is not None:
        data["simpler"] = {
            "first_bad": simpler.first_bad,
            "culprit": outcome.simpler_culprit,
            "commit": _commit(facts, outcome.simpler_culprit),
            "candidates": simpler.suspects,
            "candidate_subjects": _subjects(facts, simpler.suspects),
            # The level's own ends: one bump's pointers, or a stretch of bumps' combined move.
            "range": [simpler.candidates[0], simpler.candidates[-1]],
            "direction": outcome.direction,
            "pypto": simpler.anchor,
            "merged": _merged(facts.simpler_merged),
            "submodules": [
                {"path": path, "old": old, "new": new}
                for path, old, new in facts.simpler_submodules
            ],
        }
    if facts.triage is not None:
        data["triage"] = {
            "status": facts.triage.status,
            "summary": facts.triage.summary,
            "changed": list(facts.triage.changed),
            "added": list(facts.triage.added),
            "removed": list(facts.triage.removed),
        }
    return data


def _headline(outcome: Outcome, facts: ReportFacts) -> str:
    if outcome.drift:
        culprit = (outcome.pypto.first_bad or "")[:12]
        pointed = f"the bisect pointed at pypto {culprit}" if culprit else "no culprit was named"
        return (
            f"Not trusted: the environment drifted during the session "
            f"({' and '.join(outcome.drift)} now {_fail(outcome.drift)}); {pointed}."
        )
    if outcome.endpoint_failure is not None:
        return f"Stopped before bisecting: {outcome.endpoint_failure}."
    if not outcome.finished and outcome.rejudged is not None:
        pending = outcome.pending
        ends = outcome.pypto.candidates
        at = {ends[0]: 0, ends[-1]: len(ends) - 1}.get(pending.pypto) if pending else None
        # Only where an end's recorded runs now give the other verdict: a drift check's re-run
        # of the known-good commit, or a re-test for confidence, is just the test named below.
        flipped = Verdict.BAD if at == 0 else Verdict.GOOD
        if (
            pending is not None
            and not pending.also
            and pending.level == "pypto"
            and at is not None
            and flipped in outcome.pypto.observations.get(at, ())
        ):
            which = "good" if at == 0 else "bad"
            now = "fails" if which == "good" else "passes"
            return (
                f"Re-judged by {outcome.rejudged}: the known-{which} commit {pending.pypto[:12]} "
                f"{now} under these limits in runs the ledger has, so they may find no regression "
                "in this range; `run` with them would run it again to tell."
            )
        return (
            f"Re-judged by {outcome.rejudged}: the ledger lacks tests these limits need; `run` "
            f"with them would test next the {outcome.pending}."
        )
    if not outcome.finished and outcome.running:
        return (
            "The bisect is in progress: a `run` holds this workdir; `status` follows it, and "
            "its reports are written when it ends."
        )
    if not outcome.finished:
        return "The bisect is not finished yet: rerun the same `run` command to continue."
    pypto = outcome.pypto
    if pypto.low_confidence is not None:
        listed = ", ".join(
            f"{pypto.candidates[i][:12]} ({p:.0%})" for i, p in pypto.low_confidence[:3]
        )
        top = pypto.low_confidence[0][1] if pypto.low_confidence else 0.0
        return (
            f"Inconclusive: low confidence: no pypto commit reached {outcome.confidence:.0%}; "
            f"the likeliest are {listed}{why_low(top, outcome.confidence)}."
        )
    if pypto.found is None and (outcome.source == "inconclusive" or outcome.simpler is not None):
        line = (
            f"Inconclusive: untestable commits border the culprit; it is one of "
            f"{len(pypto.suspects)} pypto commits"
        )
        if outcome.simpler is not None and outcome.simpler.found is not None:
            return line + " listed below: whichever brought the simpler commit named below."
        if outcome.simpler is not None:  # bumps in a row: both levels name candidates
            line += f" and one of {len(outcome.simpler.suspects)} simpler commits"
        return line + " listed below."

    culprit = pypto.first_bad or ""
    line = f"The regression came in with pypto {culprit[:12]}"
    info = facts.commits.get(culprit)
    if info is not None:
        line += f" ({info.subject})"
    line += _merge_note(_merge_culprit(outcome, facts))
    if outcome.source == "simpler" and outcome.simpler is not None:
        blamed = outcome.simpler_culprit
        if blamed is not None:
            line += f", from simpler {blamed[:12]}"
            sinfo = facts.commits.get(blamed)
            if sinfo is not None:
                line += f" ({sinfo.subject})"
            line += _merge_note(facts.simpler_merged)
            if outcome.split is not None and outcome.split.carrier == "both":
                line += "; pypto's own code change in it regresses too (both halves fail alone)"
            if outcome.simpler.found is not None and blamed != outcome.simpler.first_bad:
                line += ", whose removal by a backward pointer move brought it"
        else:
            line += f"; the simpler commit is one of {len(outcome.simpler.suspects)} listed below"
    if facts.noop:
        # Nothing in the culprit's build changed: a lie or the environment is the likelier story.
        return (
            f"Check before trusting: {line[0].lower()}{line[1:]}, but its {facts.noop} build is "
            "identical to its parent's (see the notes)."
        )
    return line + "."


def _submodule_lines(
    moves: Sequence[tuple[str, str | None, str | None]], whose: str = "simpler"
) -> list[str]:
    """What a culprit does to its project's other submodules (simpler's own, or pypto's besides
    the runtime): the code it brings lies in the commits between the two pointers, which the
    bisect does not look into."""
    lines = []
    for path, old, new in moves:
        if old is None or new is None:
            done = f"adds `{path}` at `{new[:12]}`" if new else f"removes `{path}`"
            lines.append(f"It {done}, a submodule of {whose}'s.")
        else:
            span = f"{old[:12]}..{new[:12]}"
            lines.append(
                f"It moves {whose}'s submodule `{path}` `{old[:12]}` -> `{new[:12]}`: a change "
                f"there lies in that submodule's commits between the two (`git log {span}` in "
                f"`{path}`), which the bisect does not look into."
            )
    return [*lines, ""] if lines else []


def _commit_block(
    title: str, info: CommitInfo | None, sha: str, stat: str, patch: str
) -> list[str]:
    lines = [f"## {title}", ""]
    if info is not None:
        lines += [
            f"- commit `{info.sha}`",
            f"- subject: {info.subject}",
            f"- author: {info.author} <{info.author_email}>",
            f"- date: {info.date}",
        ]
    else:
        lines.append(f"- commit `{sha}`")
    if stat.strip():
        lines += ["", "```", stat.rstrip(), "```"]
    hunks = interesting_hunks(patch)
    if hunks:
        lines += [
            "",
            "Hunks touching dtype, casts, precision, rounding, layout or passes:",
            "",
            "```diff",
            hunks,
            "```",
        ]
    return [*lines, ""]


def source_also(source: str, carrier: str | None) -> str:
    """What the source line adds when both halves of a split culprit regress on their own:
    the simpler commit found is half of the answer (fixing it alone leaves pypto's change)."""
    if source == "simpler" and carrier == "both":
        return " and pypto's own code change in the culprit (both halves regress alone)"
    return ""


def _clip(text: str, width: int) -> str:
    """`text` cut to `width` at a word's end, with an ellipsis: a figure cut in the middle
    reads as another number ("0.00" of 0.007875)."""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " …"


def build_markdown(
    doc: LedgerDocument, outcome: Outcome, facts: ReportFacts, data: dict[str, Any]
) -> str:
    """The human report; `data` is `build_json`'s result for the same inputs."""
    lines = ["# Precision bisect report", "", _headline(outcome, facts), ""]
    code = outcome.exit_code if outcome.finished else "none yet (not finished)"
    source = "not known yet (not finished)"
    if outcome.finished:
        carrier = outcome.split.carrier if outcome.split is not None else None
        source = f"**{outcome.source}**{source_also(outcome.source, carrier)}"
    lines += [f"- regression source: {source}", f"- exit code: {code}"]
    inputs = doc.inputs
    lines += [
        f"- range: `{inputs.good[:12]}` (good) .. `{inputs.bad[:12]}` (bad)",
        f"- example: `{inputs.script}` on `{inputs.platform}`, {_devices(doc)}",
        f"- base image: `{inputs.base_image}` (`{inputs.base_image_id[:19]}`)",
        "",
    ]
    pypto = outcome.pypto
    if pypto.first_bad is not None:
        lines += _commit_block(
            "First bad pypto commit",
            facts.commits.get(pypto.first_bad),
            pypto.first_bad,
            facts.culprit_stat,
            facts.culprit_patch,
        )
        merged = _merge_culprit(outcome, facts)
        if merged is not None:
            lines += _merge_block(merged)
        lines += _submodule_lines(facts.pypto_submodules, "pypto")
        if outcome.change is not None and outcome.change.moved:
            change, where = outcome.change, f"`{inputs.submodule_path}`"
            if change.old is None:
                what = f"It adds the {where} submodule at `{(change.new or '')[:12]}`"
            elif change.new is None:
                what = f"It removes the {where} submodule (at `{change.old[:12]}`)"
            else:
                what = f"It moves the {where} pointer `{change.old[:12]}` -> `{change.new[:12]}`"
            lines += [
                f"{what} "
                f"({'with' if change.kind == 'pointer-and-code' else 'without'} pypto code changes"
                f"{', direction ' + outcome.direction if outcome.direction else ''}).",
                "",
            ]
            if merged is None and facts.merged is not None and facts.pointer_movers:
                lines += _movers_block(facts.merged, facts.pointer_movers, facts.crossing_mover)
        if outcome.change is not None and outcome.change.new is None:
            lines += [
                f"The culprit has no `{inputs.submodule_path}` gitlink (the pre-submodule era): "
                "it was built without a simpler wheel.",
                "",
            ]
    elif pypto.suspects:
        lines += ["## Candidate pypto commits", ""]
        for sha in pypto.suspects:
            info = facts.commits.get(sha)
            lines.append(f"- `{sha}` {info.subject if info else ''}".rstrip())
        lines.append("")
    if outcome.split is not None:
        lines += [
            "## Code or pointer?",
            "",
            f"- pypto at the parent with the new simpler: {outcome.split.pointer_half.value}",
            f"- pypto at the culprit with the old simpler: {outcome.split.code_half.value}",
            f"- {describe_split(outcome.split)}",
            "",
        ]
    if outcome.simpler is not None:
        blamed = outcome.simpler_culprit
        if blamed is not None:
            lines += _commit_block(
                "Simpler commit",
                facts.commits.get(blamed),
                blamed,
                facts.simpler_stat,
                facts.simpler_patch,
            )
            lines += _submodule_lines(facts.simpler_submodules)
            if facts.simpler_merged is not None:
                removed = outcome.simpler_culprit != outcome.simpler.first_bad
                lines += _merge_block(facts.simpler_merged, removed)
        else:
            lines += ["## Candidate simpler commits", ""]
            lines += [
                f"- `{sha}` {facts.subjects.get(sha, '')}".rstrip()
                for sha in outcome.simpler.suspects
            ]
            lines.append("")
    lines += _environment_lines(data["environment"])
    lines += _figure_lines(doc, outcome, facts)
    if data["confidence"]["pypto"] is not None:
        lines += ["## Confidence", ""]
        lines += _confidence_lines(data["confidence"], facts.subjects)
    for note in data["notes"]:
        lines.append(f"> {note}")
    if data["notes"]:
        lines.append("")
    if facts.triage is not None:
        lines += ["## Triage of the generated code", "", facts.triage.summary, ""]
        if facts.triage.diff:
            lines += ["```diff", facts.triage.diff.rstrip(), "```", ""]
    lines += [
        "## Steps",
        "",
        "| run | round | where | level | pypto | simpler | verdict | reason | build s | run s | "
        "cache | ccache |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for step in data["steps"]:
        reason = _clip(str(step["reason"]).replace("|", "\\|"), 90)
        cache = "yes" if step["from_cache"] else "no"
        lines.append(
            f"| {step['run_id']} | {step['round'] or ''} | {_where(step)} | {step['level']} | "
            f"`{step['pypto'][:12]}` | "
            f"`{(step['simpler'] or 'none')[:12]}` | {_verdict_cell(step)} | {reason} | "
            f"{step['build_s']:.1f} | {step['run_s']:.1f} | {cache} | {_ccache(step)} |"
        )
    lines += _build_environments(data["steps"])
    stats = data["stats"]
    this = stats.get("invocation_s")
    rate = stats["ccache"]["hit_rate"]
    lines += [
        "",
        f"{counted(stats['tests'], 'test')} in {counted(stats['rounds'], 'round')}, builds: "
        + ", ".join(
            f"{package} {count}"
            + (
                f" ({stats['builds_ahead'][package]} ahead)"
                if stats["builds_ahead"].get(package)
                else ""
            )
            for package, count in (
                ("pypto", stats["builds"]["pypto"]),
                ("simpler", stats["builds"]["simpler"]),
            )
        )
        + f", cache hits {stats['cache_hits']}, "
        + (f"ccache hit rate {rate:.0%}, " if rate is not None else "")
        + f"source export {stats['export_s']} s, {stats['wall_s']} s "
        f"in the session" + (f" ({this} s in this invocation)." if this is not None else "."),
        "",
    ]
    if facts.reproduce:
        lines += ["## Reproduce", "", "```sh", facts.reproduce, "```", ""]
    if facts.bisect_log:
        lines += [
            "## git bisect log",
            "",
            "`git bisect replay` accepts this (first level, pypto):",
            "",
            "```",
            facts.bisect_log.rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines)


def _ccache(step: Mapping[str, Any]) -> str:
    """ccache hits/compilations of the builds this step made, e.g. `pypto 180/180`."""
    return ", ".join(f"{k} {v[0]}/{v[0] + v[1]}" for k, v in sorted(step["ccache"].items()))


def _build_environments(steps: list[dict[str, Any]]) -> list[str]:
    """Which build tools built what: the resolved pins are part of every verdict's inputs."""
    seen: dict[tuple[str, str], set[str]] = {}
    for step in steps:
        for package, tools in step.get("build_tools", {}).items():
            builder = step["builders"].get(package, "")
            sha = step["pypto"] if package == "pypto" else step["simpler"] or ""
            seen.setdefault((" ".join(tools), builder), set()).add(f"{package} {sha[:12]}")
    if not seen:
        return []
    lines = [
        "",
        "## Build environments",
        "",
        "| build tools | builder image | built |",
        "|---|---|---|",
    ]
    for (tools, builder), built in sorted(seen.items()):
        listed = ", ".join(sorted(built)[:6]) + (" ..." if len(built) > 6 else "")
        lines.append(f"| {tools} | `{builder[7:19] or '-'}` | {listed} |")
    return lines


def strict_json(data: Any) -> Any:
    """`data` with every NaN and infinity as the strings "NaN", "Infinity", "-Infinity": a
    precision figure can be either, and strict JSON readers (jq, JavaScript, CI) refuse the bare
    constants Python writes for them."""
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {key: strict_json(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [strict_json(value) for value in data]
    return data


def write_reports(
    workdir: Path, doc: LedgerDocument, outcome: Outcome, facts: ReportFacts
) -> tuple[Path, Path, dict[str, Any]]:
    """Write report.json and report.md; return their paths and the report.json data."""
    workdir.mkdir(parents=True, exist_ok=True)
    json_path = workdir / "report.json"
    md_path = workdir / "report.md"
    drawn = plot(_levels(doc, outcome), workdir / PLOT_NAME)
    facts.plot = PLOT_NAME if drawn is not None else ""
    if drawn is None:
        (workdir / PLOT_NAME).unlink(missing_ok=True)
    data = build_json(doc, outcome, facts)
    for path, text in (
        (json_path, json.dumps(strict_json(data), indent=2, allow_nan=False) + "\n"),
        (md_path, build_markdown(doc, outcome, facts, data)),
    ):
        write_text_atomic(path, text)  # never half-written
    return json_path, md_path, data
