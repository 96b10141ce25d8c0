"""The figures along the tested commits: series from ledger attempts, and a real PNG."""

from __future__ import annotations

import pytest

from runner.ledger import Attempt
from runner.plots import plot, present, series
from runner.search import Verdict
from tests.fixtures.attempts import recorded

SHAS = [f"{i:040x}" for i in range(6)]


def attempt(n: int, index: int, verdict: Verdict, **metrics: float) -> Attempt:
    return recorded(f"{n:03d}", pypto=SHAS[index], verdict=verdict, metrics=metrics)


RUNS = [
    attempt(0, 0, Verdict.GOOD),
    attempt(1, 5, Verdict.BAD, max_abs_diff=0.004, mismatch_ratio=0.5),
    attempt(2, 3, Verdict.BAD, max_abs_diff=0.003, mismatch_ratio=0.25),
    attempt(3, 2, Verdict.GOOD),
    attempt(4, 3, Verdict.BAD, max_abs_diff=0.005, mismatch_ratio=0.25),
]


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The matplotlib figures `plot` saves, kept for the test to look at."""
    from matplotlib.figure import Figure

    figures: list[Figure] = []
    save = Figure.savefig

    def keep(fig: Figure, *args, **kwargs) -> None:
        figures.append(fig)
        save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def test_series_follow_candidate_order_and_count_clean_passes_as_zero():
    points = series(RUNS, SHAS)

    assert [p.index for p in points] == [0, 2, 3, 5]
    assert points[2].values["max_abs_diff"] == [0.003, 0.005]
    assert points[1].values["max_abs_diff"] == [0.0]
    assert points[2].verdicts == ["bad", "bad"]
    assert present(points) == ["mismatch_ratio", "max_abs_diff"]


def test_the_plot_is_a_png_with_the_culprit_marked_and_absent_without_figures(tmp_path):
    drawn = plot([("pypto", series(RUNS, SHAS), 3)], tmp_path / "metrics.png")

    assert drawn is not None and drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn.stat().st_size > 2000
    assert plot([("pypto", series(RUNS[:1], SHAS), 3)], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_a_plot_of_the_same_figures_is_kept_and_redrawn_when_they_change(tmp_path):
    path = tmp_path / "metrics.png"
    plot([("pypto", series(RUNS, SHAS), 3)], path)
    path.write_bytes(b"kept")  # marks the file: a redraw would replace it

    assert plot([("pypto", series(RUNS, SHAS), 3)], path) == path
    assert path.read_bytes() == b"kept", "nothing new: not drawn again"
    plot([("pypto", series(RUNS, SHAS), 5)], path)  # the culprit moved
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_commit_order_is_marked_in_whole_commits(tmp_path, drawn):
    """Three commits apart: matplotlib would tick 0, 0.5, 1, ... where no commit is."""
    runs = [
        attempt(0, 0, Verdict.GOOD),
        attempt(1, 1, Verdict.BAD, max_abs_diff=0.004),
        attempt(2, 2, Verdict.BAD, max_abs_diff=0.006),
    ]

    plot([("pypto", series(runs, SHAS), 1)], tmp_path / "metrics.png")

    [figure] = drawn
    [ax] = [a for a in figure.axes if a.get_visible() and a.axison]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_failing_run_limits_judged_good_has_no_zero_for_a_figure_it_did_not_print():
    """--max-mismatch-ratio re-judged a failing run good: it printed a mismatch ratio and no
    max abs diff, so the table must not show it a 0 for the latter."""
    runs = [
        attempt(0, 0, Verdict.GOOD),
        recorded(
            "001",
            pypto=SHAS[1],
            verdict=Verdict.GOOD,
            metrics={"mismatch_ratio": 0.004, "mismatched": 16, "max_abs_diff_count": 2},
        ),
        attempt(2, 2, Verdict.BAD, max_abs_diff=0.5, mismatch_ratio=0.5),
    ]

    points = series(runs, SHAS)

    assert points[0].values == {
        "mismatch_ratio": [0.0],
        "max_abs_diff": [0.0],
        "max_rel_diff": [0.0],
    }
    assert points[1].values == {"mismatch_ratio": [0.004]}
    assert points[1].marks == {"mismatch_ratio": ["good"]}


def test_nan_and_infinite_figures_are_drawn_on_top_of_the_plot(tmp_path, drawn):
    runs = [
        attempt(0, 0, Verdict.GOOD, max_abs_diff=0.001),
        attempt(1, 1, Verdict.GOOD, max_abs_diff=0.002),
        attempt(2, 2, Verdict.BAD, max_abs_diff=float("nan")),
        attempt(3, 3, Verdict.BAD, max_abs_diff=float("inf")),
    ]

    plot([("pypto", series(runs, SHAS), 2)], tmp_path / "metrics.png")

    [figure] = drawn
    [ax] = [a for a in figure.axes if a.get_visible() and a.axison]
    texts = {t.get_text() for t in ax.texts}
    assert {"nan", "inf"} <= texts
    marked = [tuple(p) for c in ax.collections for p in c.get_offsets()]
    assert (2.0, 0.97) in marked and (3.0, 0.97) in marked
