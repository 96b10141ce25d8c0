"""The git history layer, on real generated pypto/simpler histories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.errors import BadInput, BisectError, SourceUnavailable
from runner.history import History, pointer_states
from runner.sample.histories import (
    LIBBACKTRACE_PATH,
    RUNTIME_PATH,
    Sample,
    SampleSpec,
    git,
    make_sample,
    spread_bumps,
)
from runner.sample.packages import EXAMPLE_PATH, write_lib, write_pypto, write_simpler
from runner.sources import SourceExporter

BACKWARD = SampleSpec(bumps=((6, 6), (9, 4)))
CODE_BUMP = SampleSpec(code_with_bump=frozenset({9}))


@pytest.fixture(scope="module")
def history(sample: Sample) -> History:
    return History(sample.pypto)


@dataclass
class Merged:
    """A copy of the sample's pypto with a side branch merged into main (pypto itself is linear)."""

    repo: Path
    side: str  # the side-branch commit, an ancestor of main's tip but not on its first parents
    merge: str
    before_merge: str


@pytest.fixture(scope="module")
def merged(sample: Sample, tmp_path_factory: pytest.TempPathFactory) -> Merged:
    repo = tmp_path_factory.mktemp("merged") / "pypto"
    git(repo.parent, "clone", "-q", "--no-checkout", str(sample.mirrors["pypto"]), str(repo))
    before = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "side", sample.pypto_shas[5])
    git(repo, "commit", "-q", "--allow-empty", "-m", "side work", when=30 * 86_400)
    side = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge side", "side", when=31 * 86_400)
    return Merged(repo, side, git(repo, "rev-parse", "HEAD"), before)


@dataclass
class Branched:
    """A simpler clone with a side branch off index 5 (two commits) merged back at the tip."""

    repo: Path
    branch: list[str]
    merge: str


@pytest.fixture(scope="module")
def branched(sample: Sample, tmp_path_factory: pytest.TempPathFactory) -> Branched:
    repo = tmp_path_factory.mktemp("branched") / "simpler"
    git(repo.parent, "clone", "-q", str(sample.mirrors["simpler"]), str(repo))
    git(repo, "checkout", "-q", "-b", "experiment", sample.simpler_shas[5])
    branch = []
    for step in range(2):
        (repo / "EXPERIMENT").write_text(f"step {step}\n")
        git(repo, "add", "EXPERIMENT")
        git(repo, "commit", "-q", "-m", f"experiment {step}", when=40 * 86_400 + step)
        branch.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge experiment", "experiment", when=50 * 86_400)
    return Branched(repo, branch, git(repo, "rev-parse", "HEAD"))


# --- resolving revisions ----------------------------------------------------------------------


def test_revisions_resolve_to_full_shas_however_they_are_named(sample, history):
    tip = sample.pypto_shas[-1]
    assert history.resolve(tip[:8]) == tip
    assert history.resolve("main") == tip
    assert history.resolve("HEAD") == tip
    assert history.resolve("HEAD~2") == sample.pypto_shas[-3]


def test_subjects_leave_out_a_commit_the_repository_lacks_and_keep_the_rest(sample, history):
    known = sample.pypto_shas[:3]
    gone = "66a3337523" + "0" * 30  # a pin force-pushed away

    subjects = history.subjects([*known, gone])

    assert set(subjects) == set(known)
    assert all(subjects.values())


@pytest.mark.parametrize("rev", ["no-such-branch", "deadbeef", "HEAD~99", "--all"])
def test_an_unknown_revision_is_a_one_line_error_naming_it(history, rev):
    with pytest.raises(BadInput) as caught:
        history.resolve(rev)
    message = str(caught.value)
    assert rev in message
    assert "\n" not in message


def test_a_directory_that_is_not_a_repository_is_refused(sample, tmp_path):
    for path in (tmp_path, tmp_path / "missing"):
        with pytest.raises(BadInput, match="not a git repository"):
            History(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_checkout_another_user_owns_is_named_for_what_git_refuses(tmp_path):
    repo = tmp_path / "pypto"
    repo.mkdir()
    git(repo, "init", "-q")
    for path in (repo, *repo.rglob("*")):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    with pytest.raises(BadInput) as caught:
        History(repo)
    message = str(caught.value)
    assert message.startswith(f"git refuses {repo}: another user owns it (dubious ownership)")
    assert f"safe.directory {repo}" in message


def test_control_characters_in_subjects_and_names_are_shown_not_acted_on(tmp_path):
    """A subject with an escape sequence that clears the screen, a carriage return and a bell:
    progress lines and reports print subjects as they are."""
    repo = tmp_path / "pypto"
    repo.mkdir()
    git(repo, "init", "-q")
    subprocess.run(
        [
            "git",
            "-c",
            "user.name=Eve\x1b[31m",
            "-c",
            "user.email=e@example.com",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "fix \x1b[2Jscale\rdone\x07 \u00e9",
        ],
        cwd=repo,
        check=True,
        env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull},
    )
    history = History(repo)
    head = history.resolve("HEAD")
    assert history.subject(head) == "fix ^[[2Jscale^Mdone^G \u00e9"
    assert history.subjects([head]) == {head: "fix ^[[2Jscale^Mdone^G \u00e9"}
    assert history.commit_info(head).author == "Eve^[[31m"


# --- first-parent ranges ----------------------------------------------------------------------


def test_the_range_runs_oldest_first_from_after_good_to_bad(sample, history):
    candidates = history.first_parent_range(sample.pypto_shas[2][:10], "HEAD")
    assert candidates == sample.pypto_shas[3:]
    assert len(history.first_parent_range("HEAD~1", "HEAD")) == 1


def test_a_range_through_a_merge_follows_first_parents_only(sample, merged):
    candidates = History(merged.repo).first_parent_range(sample.pypto_shas[4], "main")
    assert candidates == [*sample.pypto_shas[5:], merged.merge]
    assert merged.side not in candidates


def test_a_merge_lists_the_commits_it_brings_and_its_branch_to_bisect(sample, merged, tmp_path):
    history = History(merged.repo)
    brought = history.merged(merged.merge)
    assert brought is not None
    assert brought.commits == ((merged.side, "side work"),)
    assert brought.branch == (sample.pypto_shas[5], merged.side)
    assert history.merged(merged.before_merge) is None
    assert history.merged(sample.pypto_shas[0]) is None  # the root commit

    # A branch that merged main in on the way forks at a commit off its own first parents:
    # no range of this tool covers it, so none is offered.
    repo = tmp_path / "pypto"
    git(tmp_path, "clone", "-q", str(merged.repo), str(repo))
    git(repo, "checkout", "-q", "-b", "topic", sample.pypto_shas[3])
    git(repo, "commit", "-q", "--allow-empty", "-m", "topic 1", when=40 * 86_400)
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge main into topic", sample.pypto_shas[6])
    git(repo, "commit", "-q", "--allow-empty", "-m", "topic 2", when=41 * 86_400)
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge topic", "topic", when=42 * 86_400)
    topic = History(repo).merged("HEAD")
    assert topic is not None and topic.branch is None
    assert [subject for _, subject in topic.commits] == [
        "topic 2",
        "Merge main into topic",
        "topic 1",
    ]


def test_a_commit_that_moves_a_submodule_of_its_own_says_from_where_to_where(sample):
    simpler = History(sample.runtime_gitdir)
    nested = sample.spec.nested_submodule_at
    [(path, old, new)] = simpler.submodule_moves(sample.simpler_shas[nested])
    assert (path, old) == ("third_party/isa", None) and new is not None and len(new) == 40
    assert simpler.submodule_moves(sample.simpler_shas[nested + 1]) == []
    assert simpler.submodule_moves(sample.simpler_shas[0]) == []  # the root: no parent

    from runner.report import _submodule_lines

    moved = _submodule_lines([("third_party/isa", "1" * 40, "2" * 40)])
    assert moved[0].startswith("It moves simpler's submodule `third_party/isa` `111111111111` -> ")
    assert "`git log 111111111111..222222222222` in `third_party/isa`" in moved[0]
    assert _submodule_lines([]) == []


def test_a_merge_reached_through_its_merged_parent_brings_the_first_parents_line(tmp_path):
    """An old runtime pointer on a feature branch that main merged later: the search reaches the
    merge from the branch, so what it brings is main's side, and its diff is against the branch."""
    repo = tmp_path / "simpler"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    step = iter(range(1, 100))

    def commit(name: str, text: str) -> None:
        (repo / name).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", text.strip(), when=next(step) * 86_400)

    commit("base.c", "s0\n")
    git(repo, "checkout", "-q", "-b", "feat")
    commit("feat.c", "f1\n")
    commit("feat.c", "f2\n")
    git(repo, "checkout", "-q", "main")
    commit("main.c", "s1\n")
    commit("scale.c", "s2 regression\n")
    git(repo, "merge", "-q", "--no-ff", "-m", "s3 Merge feat", "feat", when=next(step) * 86_400)
    history = History(repo)
    merge = history.resolve("main")
    first, branch = history.parents(merge)

    from_branch = history.merged(merge, since=branch)
    assert from_branch is not None and from_branch.branch is None
    assert [subject for _, subject in from_branch.commits] == ["s2 regression", "s1"]
    assert "scale.c" in history.stat(merge, since=branch)
    assert "feat.c" not in history.stat(merge, since=branch)
    assert "+s2 regression" in history.patch(merge, since=branch)
    # From the first parent (or with no `since`), the branch's commits, as before.
    for since in (first, None):
        brought = history.merged(merge, since=since)
        assert brought is not None
        assert [subject for _, subject in brought.commits] == ["f2", "f1"]
    assert "feat.c" in history.stat(merge) and "scale.c" not in history.stat(merge)

    # The line to bisect inside the merge: the other parent's first parents, oldest first.
    subjects = lambda shas: [history.subject(sha) for sha in shas]  # noqa: E731
    assert subjects(history.merged_line(merge, branch)) == ["s1", "s2 regression"]
    assert subjects(history.merged_line(merge, first)) == ["f1", "f2"]
    assert history.merged_line(first, history.parents(first)[0]) == []  # no merge
    assert history.merged_line(merge, merge) == []  # not reached through a parent
    # From a commit before either parent: both sides bring commits, no one line to bisect.
    assert history.merged_line(merge, history.parents(first)[0]) == []

    # Which parent the search passed: forward from the branch, backward onto it (the merge's
    # removal blamed), or along the first parent (nothing to change).
    from runner.findings import passed_parent

    assert passed_parent([branch, merge], 1, merge, history.parents) == branch
    assert passed_parent([merge, branch], 1, merge, history.parents) == branch
    assert passed_parent([first, merge], 1, merge, history.parents) is None
    assert passed_parent([merge, first], 1, merge, history.parents) is None


@pytest.mark.parametrize(
    ("good", "bad", "complaint"),
    [
        ("HEAD~3", "HEAD~3", "same commit"),
        ("HEAD", "HEAD~3", "swap them"),
    ],
)
def test_endpoints_in_the_wrong_shape_are_refused(history, good, bad, complaint):
    with pytest.raises(BadInput, match=complaint) as caught:
        history.first_parent_range(good, bad)
    assert good in str(caught.value)


def test_a_merge_reached_from_inside_its_other_side_brings_the_rest_of_that_side(tmp_path):
    """A merge with `--no-ff` of a line that starts at its first parent (t1 t2 onto s0), reached
    by a search that came from t1 (the merge lay on another merge's line): it brings t2."""
    repo = tmp_path / "simpler"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "s0", when=1)
    git(repo, "checkout", "-q", "-b", "topic")
    for n, name in enumerate(("t1", "t2", "t3"), start=2):
        git(repo, "commit", "-q", "--allow-empty", "-m", name, when=n)
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "M", "topic", when=9)
    history = History(repo)
    merge = history.resolve("main")
    t1 = history.resolve("topic~2")

    assert [history.subject(sha) for sha in history.merged_line(merge, t1)] == ["t2", "t3"]
    through_s0 = history.merged_line(merge, history.resolve("HEAD~1"))  # its first parent
    assert [history.subject(sha) for sha in through_s0] == ["t1", "t2", "t3"]


def test_a_good_commit_off_the_bad_commits_history_is_refused(merged):
    with pytest.raises(BadInput, match="not an ancestor") as caught:
        History(merged.repo).first_parent_range("side", merged.before_merge)
    assert "'side'" in str(caught.value)


def test_a_good_commit_merged_in_from_a_side_branch_is_refused(merged):
    with pytest.raises(BadInput, match="not on its first-parent chain") as caught:
        History(merged.repo).first_parent_range(merged.side[:12], "main")
    assert merged.side[:12] in str(caught.value)
    assert f"it came in with merge {merged.merge[:12]}" in str(caught.value)


# --- gitlinks and what each commit changed ----------------------------------------------------


def test_the_runtime_gitlink_appears_where_it_was_added_and_follows_every_bump(sample, history):
    for index, sha in enumerate(sample.pypto_shas):
        assert history.gitlink(sha) == sample.gitlink(index)
    assert [history.gitlink(sha) for sha in sample.pypto_shas[:3]] == [None, None, None]
    assert history.gitlink(sample.pypto_shas[0], "3rdparty/libbacktrace") is None
    assert (
        history.gitlink(sample.pypto_shas[1], "3rdparty/libbacktrace")
        == (sample.libbacktrace_shas[0])
    )
    assert history.gitlink("HEAD", "pypto") is None  # a directory, not a gitlink


def test_bumps_are_found_by_the_gitlink_whatever_their_subject(sample, history):
    moved = [i for i, sha in enumerate(sample.pypto_shas) if history.classify(sha).moved]
    assert moved == [3, 6, 9]
    assert "simpler" in history.subject(sample.pypto_shas[6]).lower()
    assert history.subject(sample.pypto_shas[9]).startswith("update Simpler")


def test_a_plain_code_commit_leaves_the_pointer_alone(sample, history):
    change = history.classify(sample.pypto_shas[4])
    assert change.kind == "unchanged"
    assert not change.moved
    assert change.old == change.new == sample.gitlink(4)
    assert "pypto/__init__.py" in change.changed_paths
    assert change.parent == sample.pypto_shas[3]


def test_a_pure_bump_changes_only_the_pointer(sample, history):
    change = history.classify(sample.pypto_shas[6])
    assert change.kind == "pointer-only"
    assert (change.old, change.new) == (sample.simpler_shas[2], sample.simpler_shas[6])
    assert change.changed_paths == ()


def test_a_bump_that_adapts_pypto_code_is_pointer_and_code(sample_factory):
    sample = sample_factory(CODE_BUMP)
    change = History(sample.pypto).classify(sample.pypto_shas[9])
    assert change.kind == "pointer-and-code"
    assert (change.old, change.new) == (sample.simpler_shas[6], sample.simpler_shas[8])
    assert "pypto/__init__.py" in change.changed_paths
    assert "runtime" not in change.changed_paths


def test_the_commit_adding_the_runtime_moves_it_from_nothing(sample, history):
    change = history.classify(sample.pypto_shas[3])
    assert (change.old, change.new) == (None, sample.simpler_shas[2])
    assert change.kind == "pointer-and-code"
    assert ".gitmodules" in change.changed_paths


def test_a_submodule_added_back_names_the_commit_that_removed_it_and_its_pointer(sample, tmp_path):
    from runner.session import submodule_note

    repo = tmp_path / "pypto"
    git(tmp_path, "clone", "-q", "--no-checkout", str(sample.mirrors["pypto"]), str(repo))
    git(repo, "read-tree", "HEAD")
    pinned = sample.gitlink(len(sample.pypto_shas) - 1)
    git(repo, "rm", "-q", "--cached", RUNTIME_PATH)
    git(repo, "commit", "-q", "-m", "drop the runtime", when=40 * 86_400)
    removal = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "work without it", when=41 * 86_400)
    without = git(repo, "rev-parse", "HEAD")
    history = History(repo)

    def add_back(pointer: str, when: int) -> str:
        git(repo, "reset", "-q", "--soft", without)
        git(repo, "update-index", "--add", "--cacheinfo", f"160000,{pointer},{RUNTIME_PATH}")
        git(repo, "commit", "-q", "-m", "bring the runtime back", when=when)
        return git(repo, "rev-parse", "HEAD")

    assert history.removed_before(without) == (removal, pinned)
    assert history.removed_before(sample.pypto_shas[2]) is None  # never a submodule before
    newer = add_back(sample.simpler_shas[-1], 42 * 86_400)
    note = submodule_note(history, without, history.classify(newer), RUNTIME_PATH)
    assert f"removed by {removal[:12]}" in note
    assert f"simpler moved {pinned[:12]}..{sample.simpler_shas[-1][:12]}" in note
    same = add_back(pinned, 43 * 86_400)
    note = submodule_note(history, without, history.classify(same), RUNTIME_PATH)
    assert note.endswith(f"it pinned then, {pinned[:12]}: simpler itself did not change")
    first = history.classify(sample.pypto_shas[3])
    assert submodule_note(history, sample.pypto_shas[2], first, RUNTIME_PATH) == (
        "the culprit adds the runtime submodule: there is no simpler range to bisect"
    )


def test_the_root_commit_is_compared_with_the_empty_tree(sample, history):
    change = history.classify(sample.pypto_shas[0])
    assert change.parent is None
    assert change.kind == "unchanged"
    assert {"pyproject.toml", "pypto/__init__.py"} <= set(change.changed_paths)


def test_commit_info_carries_what_a_report_prints(sample, history):
    info = history.commit_info(sample.pypto_shas[6][:9])
    assert info.sha == sample.pypto_shas[6]
    assert info.parent == sample.pypto_shas[5]
    assert info.subject == history.subject(info.sha)
    assert (info.author, info.author_email) == ("Sample Author", "author@example.com")
    assert info.date.startswith("2024-01-")
    assert history.commit_info(sample.pypto_shas[0]).parent is None


# --- states inside a bump ---------------------------------------------------------------------


def test_a_forward_bump_walks_simpler_first_parents_from_old_to_new(sample):
    direction, states = pointer_states(sample.runtime_gitdir, sample.gitlink(5), sample.gitlink(6))
    assert direction == "forward"
    assert states == sample.simpler_shas[2:7]


def test_a_backward_bump_walks_back_from_old_to_new(sample_factory):
    sample = sample_factory(BACKWARD)
    direction, states = pointer_states(sample.runtime_gitdir, sample.gitlink(8), sample.gitlink(9))
    assert direction == "backward"
    assert states == sample.simpler_shas[6:3:-1]


def test_a_diverged_bump_goes_back_to_the_merge_base_then_forward(sample, branched):
    old, new = branched.branch[-1], sample.simpler_shas[8]
    direction, states = pointer_states(branched.repo, old, new)
    assert direction == "diverged"
    assert states == [*branched.branch[::-1], *sample.simpler_shas[5:9]]


def test_a_forward_bump_off_the_first_parent_chain_follows_the_ancestry_path(branched):
    direction, states = pointer_states(str(branched.repo), branched.branch[0], branched.merge)
    assert direction == "forward"
    assert states == [branched.branch[0], branched.branch[1], branched.merge]


def test_a_pointer_that_appears_or_disappears_has_no_states_between(sample):
    assert pointer_states(sample.runtime_gitdir, None, sample.simpler_shas[2]) == (
        "added",
        [sample.simpler_shas[2]],
    )
    assert pointer_states(sample.runtime_gitdir, sample.simpler_shas[2], None) == (
        "removed",
        [sample.simpler_shas[2]],
    )


def test_a_bump_to_an_unrelated_history_names_no_simpler_commit_and_says_why(sample, tmp_path):
    repo = tmp_path / "simpler"
    git(tmp_path, "clone", "-q", str(sample.mirrors["simpler"]), str(repo))
    git(repo, "checkout", "-q", "--orphan", "replaced")
    git(repo, "commit", "-q", "-m", "another runtime", when=60 * 86_400)
    other = git(repo, "rev-parse", "HEAD")

    with pytest.raises(BisectError, match="share no history") as raised:
        pointer_states(repo, sample.simpler_shas[2], other)

    assert "no simpler commit can be named, only the pypto commit that switched" in str(
        raised.value
    )
    assert not isinstance(raised.value, SourceUnavailable)


def test_a_submodule_commit_missing_locally_is_source_unavailable(sample):
    missing = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(SourceUnavailable, match=missing[:12]):
        pointer_states(sample.runtime_gitdir, sample.simpler_shas[2], missing)


# --- the user's checkout ----------------------------------------------------------------------


def test_asking_about_history_leaves_the_users_checkout_untouched(sample, checkout_state):
    before = checkout_state(sample.pypto)
    history = History(sample.pypto)
    candidates = history.first_parent_range(sample.pypto_shas[0], "HEAD")
    for sha in candidates:
        change = history.classify(sha)
        history.commit_info(sha)
        if change.moved:
            pointer_states(sample.runtime_gitdir, change.old, change.new)
    history.gitlink("HEAD", "3rdparty/libbacktrace")
    with pytest.raises(BadInput):
        history.resolve("nope")
    assert checkout_state(sample.pypto) == before


def test_a_git_dir_inherited_from_a_git_hook_does_not_redirect_history_questions(sample, merged):
    # A hook exports GIT_DIR before the tool starts; questions about pypto must still be answered
    # by pypto, not by the repository the hook ran in.
    ask = "import sys; from runner.history import History; print(History(sys.argv[1]).resolve('@'))"
    answered = subprocess.run(
        [sys.executable, "-c", ask, str(sample.pypto)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "GIT_DIR": str(merged.repo / ".git")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert answered.stdout.strip() == sample.pypto_shas[-1] != merged.merge


def test_history_and_the_exporter_read_the_same_pins(sample, history, tmp_path):
    exporter = SourceExporter(sample.pypto, tmp_path / "cache")
    for sha in sample.pypto_shas:
        pinned = exporter.check(sha)
        for path in (RUNTIME_PATH, LIBBACKTRACE_PATH):
            assert history.gitlink(sha, path) == pinned.get(path)


# --- the sample itself ------------------------------------------------------------------------


def test_the_sample_checkout_is_offline_but_holds_every_submodule_object(sample):
    urls = subprocess.run(
        ["git", "config", "--get-regexp", r"submodule\..*\.url"],
        cwd=sample.pypto,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1::2]
    assert urls
    assert not any(Path(url).exists() for url in urls)
    modules = sample.pypto / ".git" / "modules"
    for path in (modules / "simpler", modules / "simpler" / "modules" / "third_party" / "isa"):
        assert History(path).resolve("HEAD")
    for sha in sample.simpler_shas:
        assert History(modules / "simpler").resolve(sha) == sha


def test_the_same_spec_gives_the_same_shas_anywhere(sample, tmp_path):
    again = make_sample(tmp_path / "again")
    assert again.pypto_shas == sample.pypto_shas
    assert again.simpler_shas == sample.simpler_shas
    shutil.rmtree(tmp_path / "again")


@pytest.mark.parametrize(
    "spec",
    [
        {"bumps": ((2, 4),)},
        {"bumps": ((7, 6), (6, 5))},
        {"bumps": ((6, 2),)},
        {"pypto_regression_at": 6},
        {"code_with_bump": frozenset({4})},
        {"simpler_regression_at": 11},
        {"example_seconds": -1.0},
    ],
)
def test_an_impossible_sample_spec_is_refused(spec):
    with pytest.raises(ValueError):
        SampleSpec(**spec)


def test_the_expected_culprit_descends_into_the_bump_that_brought_the_regression(sample_factory):
    sample = sample_factory(SampleSpec(simpler_regression_at=7))
    culprit = sample.expected_first_bad()
    assert (culprit.pypto_index, culprit.simpler_index) == (9, 7)
    assert culprit.simpler_sha == sample.simpler_shas[7]
    code = SampleSpec(pypto_regression_at=7).bad
    assert [code(i) for i in (6, 7, 12)] == [False, True, True]


def test_gitlinks_of_a_whole_range_match_one_by_one_lookups(sample_factory):
    spec = SampleSpec(
        pypto_commits=10,
        simpler_commits=8,
        runtime_added_at=3,
        bumps=((5, 7), (7, 4), (8, 6)),
        code_with_bump=frozenset({7}),
        libbacktrace_url_change_at=4,
    )
    sample = sample_factory(spec)
    history = History(sample.pypto)

    for start in (0, 2, 3, 6):
        chain = sample.pypto_shas[start:]
        assert history.gitlinks(chain) == {sha: history.gitlink(sha) for sha in chain}
    assert history.gitlinks(sample.pypto_shas, LIBBACKTRACE_PATH) == {
        sha: history.gitlink(sha, LIBBACKTRACE_PATH) for sha in sample.pypto_shas
    }


def test_spread_bumps_move_the_pointer_every_few_commits_by_the_same_span(sample_factory):
    bumps = spread_bumps(first_at=4, every=3, count=3, span=5, start=1)
    assert bumps == ((4, 6), (7, 11), (10, 16))
    spec = SampleSpec(
        pypto_commits=11,
        simpler_commits=16,
        runtime_added_at=2,
        runtime_initial=1,
        bumps=bumps,
        libbacktrace_url_change_at=3,
    )
    sample = sample_factory(spec)
    history = History(sample.pypto)
    links = [history.gitlink(sha) for sha in sample.pypto_shas]
    moved = [i for i in range(1, len(links)) if links[i] != links[i - 1]]
    assert moved == [2, 4, 7, 10]
    assert [sample.simpler_index(links[i]) for i in moved] == [1, 6, 11, 16]


def test_an_example_given_seconds_waits_that_long_and_still_passes(tmp_path):
    write_lib(tmp_path / "lib")
    assert "time.sleep(1.5)" not in (tmp_path / "lib" / EXAMPLE_PATH).read_text()
    write_lib(tmp_path / "slow", example_seconds=1.5)
    assert "time.sleep(1.5)" in (tmp_path / "slow" / EXAMPLE_PATH).read_text()
    write_pypto(tmp_path / "pkg", revision=0, uses_simpler=False)
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, str(tmp_path / "slow" / EXAMPLE_PATH), "-p", "a2a3sim"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "pkg")},
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "[RUN] PASS" in completed.stdout
    assert time.monotonic() - started >= 1.5


def test_compile_work_goes_into_the_unit_each_commit_changes_and_differs_per_commit(tmp_path):
    """The bench's model of real C++ builds (the compiler itself run by the builder tests)."""
    for revision in (3, 4):
        write_pypto(tmp_path / f"pypto{revision}", revision=revision, native=True, compile_work=2)
        write_simpler(
            tmp_path / f"simpler{revision}", revision=revision, native=True, compile_work=2
        )
    units = [(tmp_path / f"pypto{r}" / "src" / "codegen.cpp").read_text() for r in (3, 4)]
    assert all(unit.count("static_assert(churn(") == 2 for unit in units)
    assert units[0] != units[1]
    assert "src/tuning.cpp" in (tmp_path / "simpler3" / "CMakeLists.txt").read_text()
    write_simpler(tmp_path / "simpler3", revision=5, native=True)  # work taken out again
    assert not (tmp_path / "simpler3" / "src" / "tuning.cpp").exists()
    assert "tuning.cpp" not in (tmp_path / "simpler3" / "CMakeLists.txt").read_text()


def test_text_that_is_not_utf8_reads_as_git_log_shows_it_and_writes_into_a_report(tmp_path):
    """A Latin-1 commit message without an encoding header, and a Latin-1 source line in its
    diff: the report's text must be writable UTF-8 (it stopped the run after the bisect)."""
    repo = tmp_path / "pypto"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_bytes(b"x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "start")
    (repo / "a.py").write_bytes(b"x = 2  # na\xefve\n")
    git(repo, "add", "a.py")
    message = tmp_path / "message"
    message.write_bytes(b"fix: caf\xe9 na\xefve\n")
    git(repo, "-c", "i18n.commitEncoding=", "commit", "-q", "-F", str(message))
    history = History(repo)
    head = history.resolve("HEAD")

    texts = [
        history.subject(head),
        history.subjects([head])[head],
        history.commit_info(head).subject,
        history.patch(head),
        history.stat(head),
    ]

    assert texts[0] == texts[1] == texts[2] == "fix: caf\ufffd na\ufffdve"
    assert "na\ufffdve" in texts[3]
    for text in texts:
        text.encode("utf-8")  # strict: no escaped byte left


def test_an_ambiguous_short_sha_says_so_rather_than_unknown(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "start")
    tree = git(repo, "rev-parse", "HEAD^{tree}")
    seen: dict[str, str] = {}
    for n in range(5000):  # commits until two share their first four hex digits
        sha = git(repo, "commit-tree", tree, "-m", f"probe {n}")
        if sha[:4] in seen:
            break
        seen[sha[:4]] = sha
    history = History(repo)

    with pytest.raises(BadInput, match=rf"^'{sha[:4]}' is ambiguous in .*give more of the SHA$"):
        history.resolve(sha[:4])
    assert history.resolve(sha[:12]) == sha


def test_a_directory_inside_a_checkout_names_the_checkout(sample):
    with pytest.raises(BadInput, match=rf"lies inside {sample.pypto}\); pass the root"):
        History(sample.pypto / "pypto")


def test_a_range_a_shallow_clone_cuts_off_says_the_clone_is_shallow(sample, tmp_path):
    """The good commit lies beyond the clone's depth: git knows nothing of how it relates."""
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "3", f"file://{sample.mirrors['pypto']}", str(shallow)],
        check=True,
    )
    tip = sample.pypto_shas[-1]
    old = sample.pypto_shas[1]
    subprocess.run(["git", "-C", str(shallow), "fetch", "-q", "--depth", "1", "origin", old])
    history = History(shallow)

    with pytest.raises(BadInput, match=r"is a shallow clone.*git fetch --unshallow"):
        history.first_parent_range(old, tip)
    assert history.first_parent_range(sample.pypto_shas[-3], tip) == sample.pypto_shas[-2:]
    # A commit beyond the depth is unknown to it: the same advice.
    with pytest.raises(BadInput, match=r"unknown revision .*is a shallow clone.*--unshallow"):
        history.resolve(sample.pypto_shas[0])


def test_a_name_that_is_a_tag_and_a_branch_of_other_commits_is_refused(sample, tmp_path):
    clone = tmp_path / "pypto"
    git(tmp_path, "clone", "-q", str(sample.mirrors["pypto"]), str(clone))
    git(clone, "tag", "amb", sample.pypto_shas[2])
    git(clone, "branch", "amb", sample.pypto_shas[5])
    git(clone, "tag", "-a", "-m", "same", "same", sample.pypto_shas[4])
    git(clone, "branch", "same", sample.pypto_shas[4])
    history = History(clone)

    with pytest.raises(BadInput, match=r"names both refs/heads/amb and refs/tags/amb"):
        history.resolve("amb")
    assert history.resolve("refs/heads/amb") == sample.pypto_shas[5]
    assert history.resolve("same") == sample.pypto_shas[4]  # both name one commit: no doubt
