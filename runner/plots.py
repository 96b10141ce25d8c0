"""How the precision figures move along the tested commits: a table's data and a PNG plot.

A culprit is easier to trust when its figures jump where the verdicts flip, and easier to doubt
when they drift or scatter; a plot shows that at a glance. The series come from the ledger alone,
so `report` can redraw them at any time.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.files import write_atomic
from runner.ledger import Attempt
from runner.verdict import printed_failure

FIGURES = ("mismatch_ratio", "max_abs_diff", "max_rel_diff", "ratio_pct")


@dataclass
class Point:
    """One tested commit: its position in the level's candidates and every run's figures."""

    index: int
    sha: str
    verdicts: list[str] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    marks: dict[str, list[str]] = field(default_factory=dict)  # each value's run's verdict


def series(
    attempts: Sequence[Attempt],
    candidates: Sequence[str],
    runs: Mapping[int, Sequence[str]] | None = None,
) -> list[Point]:
    """Points in candidate order. Without `runs` a candidate is a pypto commit and each of its
    attempts counts; with it, a candidate's points are the attempts whose run ids `runs` gives
    for its index: the ones its level's model counted (a simpler state's runs with another pypto
    commit are not its figures). A passing run without figures counts as 0 for the difference
    figures, as the example compared and found nothing beyond tolerance to print; a run that
    printed a failure has no value for a figure it did not print, whatever limits judged it."""
    if runs is None:
        order = {sha: i for i, sha in enumerate(candidates)}
        chosen = [(order[a.pypto_sha], a) for a in attempts if a.pypto_sha in order]
    else:
        by_id = {attempt.run_id: attempt for attempt in attempts}
        chosen = [(i, by_id[r]) for i, ids in runs.items() for r in ids if r in by_id]
    points: dict[int, Point] = {}
    for index, attempt in chosen:
        point = points.setdefault(index, Point(index, candidates[index]))
        point.verdicts.append(attempt.verdict.value)
        clean = attempt.verdict.value == "good" and not printed_failure(attempt.metrics)
        for name in FIGURES:
            value = attempt.metrics.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = float(value)
            elif clean and name != "ratio_pct":
                value = 0.0
            else:
                continue
            point.values.setdefault(name, []).append(value)
            point.marks.setdefault(name, []).append(attempt.verdict.value)
    return [points[i] for i in sorted(points)]


def _finite_mean(values: Sequence[float] | None) -> float | None:
    """The mean of a commit's finite values for the line through the points; None without."""
    finite = [v for v in values or [] if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def present(points: Sequence[Point]) -> list[str]:
    """The figures worth showing: recorded somewhere, and not zero everywhere."""
    return [
        name for name in FIGURES if any(any(v != 0 for v in p.values.get(name, [])) for p in points)
    ]


def warm() -> None:
    """Import matplotlib in the background while a run's first builds go on: `plot`, at the end
    of the run, then costs its drawing alone (the import is most of a second)."""

    def load() -> None:
        with contextlib.suppress(Exception):  # a broken install fails again in `plot`, in the open
            import matplotlib.figure
            import matplotlib.ticker  # noqa: F401

    threading.Thread(target=load, name="matplotlib-import", daemon=True).start()


def plot(levels: Sequence[tuple[str, Sequence[Point], int | None]], path: Path) -> Path | None:
    """Draw each figure against commit order, one row per level, the culprit marked; None when
    no figure was recorded."""
    rows = [(name, pts, culprit, present(pts)) for name, pts, culprit in levels]
    rows = [row for row in rows if row[3]]
    if not rows:
        return None
    # A report rewritten with nothing new (a resume, `report`) keeps the plot it has: drawing
    # it costs more than a second, most of it importing matplotlib.
    drawn = path.with_name(path.name + ".sha256")
    digest = hashlib.sha256(repr(rows).encode()).hexdigest()
    with contextlib.suppress(OSError):
        if path.is_file() and drawn.read_text().strip() == digest:
            return path
    from matplotlib.figure import Figure  # without pyplot: no backend, no global state
    from matplotlib.ticker import MaxNLocator

    columns = max(len(row[3]) for row in rows)
    fig = Figure(figsize=(4.5 * columns, 3.2 * len(rows)))
    axes = fig.subplots(len(rows), columns, squeeze=False)
    for r, (level, pts, culprit, names) in enumerate(rows):
        for c in range(columns):
            ax = axes[r][c]
            if c >= len(names):
                ax.axis("off")
                continue
            name = names[c]
            xs, ys, colors, off = [], [], [], []
            for p in pts:
                for value, verdict in zip(
                    p.values.get(name, []), p.marks.get(name, []), strict=True
                ):
                    if not math.isfinite(value):  # NaN or infinity: off the scale, marked on top
                        off.append((p.index, "nan" if math.isnan(value) else "inf"))
                        continue
                    xs.append(p.index)
                    ys.append(value)
                    colors.append("tab:red" if verdict == "bad" else "tab:green")
            ax.scatter(xs, ys, c=colors, s=18, zorder=3)
            for x, label in off:
                ax.scatter(
                    [x], [0.97], marker="^", color="tab:red", s=30, zorder=3,
                    transform=ax.get_xaxis_transform(), clip_on=False,
                )  # fmt: skip
                ax.annotate(
                    label, (x, 0.97), xycoords=("data", "axes fraction"), xytext=(4, -3),
                    textcoords="offset points", color="tab:red", fontsize=7,
                )  # fmt: skip
            means = [
                (p.index, mean)
                for p in pts
                if (mean := _finite_mean(p.values.get(name))) is not None
            ]
            if means:
                ax.plot(*zip(*means, strict=True), color="grey", linewidth=1, zorder=2)
            if culprit is not None:
                ax.axvline(culprit, color="tab:red", linestyle="--", linewidth=1)
                ax.annotate(
                    "culprit",
                    (culprit, 1),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -12),
                    textcoords="offset points",
                    color="tab:red",
                    fontsize=8,
                )
            ax.set_title(f"{level}: {name}", fontsize=9)
            ax.set_xlabel("commit order (0 = known good)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # commits have no halves
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=90), suffix=".png")
    with contextlib.suppress(OSError):
        drawn.write_text(digest + "\n")
    return path
