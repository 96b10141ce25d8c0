"""Read-only questions about git history: ranges, gitlinks, what a commit changed.

The user's checkout is precious (often the only copy of the submodule objects on an offline NPU
host), so nothing here writes to it: no fetch, no config, no index refresh. Every command runs
through `gitcmd.Git`, with GIT_OPTIONAL_LOCKS=0 so even git's opportunistic index writes are off.
Deciding what to test is the search engine's job; this module only reports what the history is.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runner.errors import BadInput, BisectError, SourceUnavailable
from runner.gitcmd import (
    GITLINK_MODE,
    Git,
    GitFailed,
    SubmoduleEntry,
    gitlinks,
    moved_gitlinks,
    parse_gitmodules,
)

METADATA_PATHS = frozenset({".gitmodules"})

_INFO_FORMAT = "%H%x00%s%x00%an%x00%ae%x00%aI%x00%P"

Direction = Literal["forward", "backward", "diverged", "added", "removed"]
ChangeKind = Literal["unchanged", "pointer-only", "pointer-and-code"]


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    author_email: str
    date: str  # author date, strict ISO 8601
    parent: str | None  # first parent; None for a root commit


@dataclass(frozen=True)
class Merged:
    """The commits a merge brings in, as (sha, subject) newest first, and its branch as the
    (fork point, merged parent) range to bisect next, when there is one."""

    commits: tuple[tuple[str, str], ...]
    branch: tuple[str, str] | None


@dataclass(frozen=True)
class Change:
    """What a commit did to one gitlink, against its first parent."""

    commit: str
    parent: str | None
    old: str | None
    new: str | None
    kind: ChangeKind
    changed_paths: tuple[str, ...]  # everything else the commit changed (not the gitlink)

    @property
    def moved(self) -> bool:
        return self.old != self.new


def _has_commit(runner: Git, sha: str) -> bool:
    try:
        runner.output("cat-file", "-e", f"{sha}^{{commit}}")
    except GitFailed:
        return False
    return True


def _first_parent_chain(runner: Git, tip: str, stop: str) -> list[str] | None:
    """Commits on tip's first-parent chain after `stop`, newest first; None if stop is not on it."""
    lines = runner.output("rev-list", "--first-parent", "--parents", tip, f"^{stop}").splitlines()
    if not lines:
        return [] if tip == stop else None
    oldest = lines[-1].split()
    if len(oldest) < 2 or oldest[1] != stop:
        return None
    return [line.split()[0] for line in lines]


def readable(text: str) -> str:
    """Git's text for people (subjects, names, diffs): bytes that are not UTF-8 (a commit
    message in another encoding without its header, a Latin-1 source file) become U+FFFD, as
    `git log` shows them; git output keeps them escaped otherwise, for paths."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def one_line(text: str) -> str:
    """`readable` for a subject or a name, which terminals and reports print as they are:
    control characters (an escape sequence that clears the screen, a carriage return) are shown
    in caret notation, as `cat -v` does, instead of acting."""
    shown = readable(text)
    return shown if shown.isprintable() else "".join(_shown(ch) for ch in shown)


def _shown(ch: str) -> str:
    if ch == "\t" or unicodedata.category(ch) != "Cc":
        return ch
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"^{chr(ord(ch) ^ 0x40)}"
    return "\ufffd"  # (C1 controls: no caret form)


class History:
    """One repository's history, asked about by commit."""

    def __init__(self, repo: Path) -> None:
        self.path = Path(repo)
        self._git = Git(self.path)

    def _run(self, *args: str, rev: str) -> str:
        """Run a read-only git command about `rev`; a failure means the revision is unknown."""
        try:
            return self._git.output(*args)
        except GitFailed:
            raise BadInput(self._unknown(rev)) from None

    def _unknown(self, rev: str) -> str:
        return (
            f"unknown revision {rev!r} in {self.path}: give a commit, branch or tag that "
            f"exists there (see `git log --first-parent --oneline`){self._shallow()}"
        )

    def has_commit(self, sha: str) -> bool:
        return _has_commit(self._git, sha)

    def resolve(self, rev: str) -> str:
        """Full SHA of a commit named any way git understands (short sha, branch, HEAD~2...)."""
        if not rev or rev.startswith("-"):
            raise BadInput(f"not a revision: {rev!r}")
        try:
            sha = self._git.output("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
        except GitFailed:
            pass
        else:
            self._unambiguous(rev, sha)
            return sha
        try:  # again, for git's reason: an ambiguous short SHA is no unknown one
            self._git.output("rev-parse", "--verify", f"{rev}^{{commit}}")
        except GitFailed as exc:
            if "ambiguous" in exc.stderr:
                raise BadInput(
                    f"{rev!r} is ambiguous in {self.path}: more than one object starts with it; "
                    "give more of the SHA"
                ) from None
        raise BadInput(self._unknown(rev))

    def _unambiguous(self, rev: str, sha: str) -> None:
        """Refuse a name that is both a tag and a branch of other commits: git takes the tag
        (and only warns), and a bisect end must be the commit the user means."""
        if not re.fullmatch(r"[\w][\w./-]*", rev) or re.fullmatch(r"[0-9a-f]{7,40}", rev):
            return  # not a plain ref name (HEAD~2, a SHA): nothing to be ambiguous about
        try:
            listed = self._git.output(
                "for-each-ref",
                "--format=%(refname) %(objectname) %(*objectname)",
                f"refs/tags/{rev}",
                f"refs/heads/{rev}",
                f"refs/remotes/{rev}",
            )
        except GitFailed:
            return
        named = {}
        for line in listed.splitlines():
            ref, obj, *peeled = line.split()
            named[ref] = (peeled or [obj])[0]
        if len(named) > 1 and len(set(named.values())) > 1:
            refs = " and ".join(sorted(named))
            raise BadInput(
                f"{rev!r} names both {refs}, which point at different commits; give the full "
                f"ref (git would take {sha[:12]})"
            )

    def first_parent_range(self, good: str, bad: str) -> list[str]:
        """Candidates between the endpoints, oldest first, `bad` last and `good` excluded.

        Only the first-parent chain: that is the sequence of states the branch was actually in,
        which is what "the commit that broke it" means in a history with merges.
        """
        good_sha, bad_sha = self.resolve(good), self.resolve(bad)
        if good_sha == bad_sha:
            raise BadInput(f"good {good!r} and bad {bad!r} are the same commit {good_sha[:12]}")
        if not self.holds(bad_sha, good_sha):
            if self.holds(good_sha, bad_sha):
                raise BadInput(f"good {good!r} is newer than bad {bad!r}: swap them")
            raise BadInput(
                f"good {good!r} is not an ancestor of bad {bad!r}{self._shallow()}: pick a good "
                f"commit from `git log --first-parent {bad}`"
            )
        chain = _first_parent_chain(self._git, bad_sha, good_sha)
        if chain is None:
            if self._shallow():
                raise BadInput(
                    f"good {good!r} is not on the first-parent chain of bad {bad!r} as far as "
                    f"this checkout goes{self._shallow()}"
                )
            merge = self._merged_by(good_sha, bad_sha)
            raise BadInput(
                f"good {good!r} is an ancestor of bad {bad!r} but not on its first-parent chain "
                f"(it came in with merge {merge[:12]}): pick one from `git log --first-parent "
                f"{bad}`, the merge itself if it is good, else one before it"
            )
        return chain[::-1]

    def _merged_by(self, commit: str, tip: str) -> str:
        """The first commit of `tip`'s first-parent chain that holds `commit` (an ancestor of
        `tip` off that chain): the merge that brought it in."""
        chain = self._git.output("rev-list", "--first-parent", tip).split()
        lo, hi = 0, len(chain) - 1  # chain[hi] may not hold it; chain[0] (tip) does
        while lo < hi:  # the chain holds `commit` from its merge up to the tip
            mid = (lo + hi + 1) // 2
            if self.holds(chain[mid], commit):
                lo = mid
            else:
                hi = mid - 1
        return chain[lo]

    def _shallow(self) -> str:
        """What to say of a shallow checkout, whose cut history can hide how commits relate."""
        try:
            shallow = self._git.output("rev-parse", "--is-shallow-repository").strip() == "true"
        except GitFailed:
            return ""
        if not shallow:
            return ""
        return (
            f" ({self.path} is a shallow clone, which cuts history off; `git fetch --unshallow` "
            "there completes it)"
        )

    def gitlink(self, commit: str, path: str = "runtime") -> str | None:
        """The submodule commit pinned at `path`, or None when there is no gitlink there."""
        listed = self._run("ls-tree", "-z", commit, "--", path, rev=commit)
        return dict(gitlinks(listed, tree_format=True)).get(path)

    def submodules(self, commit: str) -> dict[str, SubmoduleEntry]:
        """Every gitlink at `commit` by path, with its `.gitmodules` entry there (the path
        stands in for the name where `.gitmodules` has none)."""
        listed = self._run("ls-tree", "-r", "-z", commit, rev=commit)
        try:
            raw = self._git.output("config", "--blob", f"{commit}:.gitmodules", "-l", "-z")
        except GitFailed:
            raw = ""
        entries = parse_gitmodules(raw.encode(errors="surrogateescape"))
        return {
            path: entries.get(path) or SubmoduleEntry(name=path, path=path, url=None)
            for path, _sha in gitlinks(listed, tree_format=True)
        }

    def gitlinks(self, chain: Sequence[str], path: str = "runtime") -> dict[str, str | None]:
        """`gitlink` for every commit of a first-parent chain (oldest first) in two git calls.

        A range of 1,500 commits would otherwise cost 1,500 `ls-tree` runs on every start and
        every `status`; only the commits that touch `path` can move the pointer.
        """
        if not chain:
            return {}
        current = self.gitlink(chain[0], path)
        result = {chain[0]: current}
        if len(chain) == 1:
            return result
        span = f"{chain[0]}..{chain[-1]}"
        shown = self._run(
            "log",
            "--first-parent",
            "--raw",
            "--no-abbrev",
            "--format=%x00%H",
            span,
            "--",
            path,
            rev=span,
        )
        moved = moved_gitlinks(shown, path)
        for commit in chain[1:]:
            current = moved.get(commit, current)
            result[commit] = current
        return result

    def removed_before(self, commit: str, path: str = "runtime") -> tuple[str, str] | None:
        """Where a submodule absent at `commit` went: the first-parent ancestor (or `commit`
        itself) that last touched `path`, when it removed a gitlink there, and the pointer it
        removed; None when `path` held no gitlink before it (never a submodule, or something
        else)."""
        touched = self._run(
            "log", "--first-parent", "-1", "--format=%H", commit, "--", path, rev=commit
        ).strip()
        if not touched or self.gitlink(touched, path) is not None:
            return None
        parent = self.parent(touched)
        pinned = self.gitlink(parent, path) if parent else None
        return (touched, pinned) if pinned is not None else None

    def subject(self, commit: str) -> str:
        return one_line(self._run("log", "-1", "--format=%s", commit, "--", rev=commit))

    def subjects(self, commits: Collection[str]) -> dict[str, str]:
        """The subject line of each commit, in one git call (unknown commits are left out: a
        pin no source holds made the whole call fail, and a report's table lost every subject)."""
        if not commits:
            return {}
        try:
            shown = self._git.output(
                "log",
                "--no-walk=unsorted",
                "--ignore-missing",
                "--format=%H%x00%s",
                *sorted(commits),
                "--",
            )
        except GitFailed:
            return {}
        pairs = (line.split("\0", 1) for line in shown.split("\n") if "\0" in line)
        return {sha: one_line(subject) for sha, subject in pairs}

    def commit_info(self, commit: str) -> CommitInfo:
        shown = self._run("log", "-1", f"--format={_INFO_FORMAT}", commit, "--", rev=commit)
        sha, subject, author, email, date, parents = shown.split("\0")
        return CommitInfo(
            sha,
            one_line(subject),
            one_line(author),
            one_line(email),
            date,
            (parents.split() or [None])[0],
        )

    def parent(self, commit: str) -> str | None:
        """First parent, or None for a root commit."""
        return self.commit_info(commit).parent

    def stat(self, commit: str, since: str | None = None) -> str:
        """`git show --stat` against the first parent, for the report; against `since` (another
        parent) when the search reached the commit from there."""
        if since is not None:
            return readable(self._run("diff", "--stat", since, commit, "--", rev=commit))
        return readable(
            self._run("show", "--first-parent", "--stat", "--format=", commit, "--", rev=commit)
        )

    def patch(self, commit: str, since: str | None = None) -> str:
        """The commit's diff against its first parent (or `since`, as for `stat`), for picking
        precision-relevant hunks."""
        if since is not None:
            return readable(self._run("diff", "--no-color", "-U3", since, commit, "--", rev=commit))
        return readable(
            self._run(
                "show", "--first-parent", "--format=", "--no-color", "-U3", commit, "--", rev=commit
            )
        )

    def submodule_moves(
        self, commit: str, since: str | None = None
    ) -> list[tuple[str, str | None, str | None]]:
        """The submodule pointers the commit moves against its first parent (or `since`, as for
        `stat`): (path, old, new), None where a submodule appears or goes."""
        base = since if since is not None else f"{commit}^"
        try:
            raw = self._run(
                "diff", "--raw", "--no-abbrev", "--no-renames", base, commit, "--", rev=commit
            )
        except (BadInput, GitFailed):
            return []  # (a root commit has no parent to compare with)
        moves = []
        for line in raw.splitlines():
            meta, _, path = line.partition("\t")
            fields = meta.lstrip(":").split()
            if len(fields) < 4 or GITLINK_MODE not in fields[:2]:
                continue
            old, new = (
                sha if mode == GITLINK_MODE else None
                for sha, mode in ((fields[2], fields[0]), (fields[3], fields[1]))
            )
            moves.append((path, old, new))
        return moves

    def parents(self, commit: str) -> list[str]:
        """The commit's parents, the first one first."""
        return self._run("rev-list", "--parents", "-n", "1", commit, "--", rev=commit).split()[1:]

    def merged(self, commit: str, since: str | None = None) -> Merged | None:
        """What a merge brings in: the commits its other parents reach and its first parent
        does not, newest first; None for a commit with one parent or none. `since`: the parent
        the search came from, when that is not the first (a path through the merged branch):
        then what the merge brings is what that parent lacks, the first parent's line."""
        first, *others = self.parents(commit) or [""]
        if not others:
            return None
        base = since if since is not None and since in others else first
        sides = [parent for parent in (first, *others) if parent != base]
        shown = self._git.output("log", "--format=%H%x00%s", *sides, "--not", base, "--")
        brought = tuple(
            (sha, one_line(subject))
            for sha, subject in (line.split("\0", 1) for line in shown.split("\n") if "\0" in line)
        )
        if base != first:  # the first parent's line is no branch of this tool's to bisect
            return Merged(brought, None)
        # Its branch is a range this tool can bisect when the fork point lies on the merged
        # parent's first-parent line, as it does for a branch merged once.
        branch = None
        if len(others) == 1:
            base = self.merge_base(first, others[0])
            line = self._git.output("rev-list", "--first-parent", others[0], "--").split()
            if base is not None and base in line:
                branch = (base, others[0])
        return Merged(brought, branch)

    def merged_line(self, merge: str, via: str) -> list[str]:
        """What a two-parent merge brings from its other parent when reached through ``via``,
        oldest first along that parent's first parents: the commits to bisect inside it. Empty
        for a commit that is no such merge.

        ``via`` is one of the merge's parents, or an earlier commit the search reached it from
        (the merge was itself on a line another merge brings): then the other parent is the one
        ``via`` does not hold, and its line starts after what ``via`` holds. That commit need
        not be the merge's ancestor: a line's first commit is reached from the outer merge's
        first parent, which only shares the line's base."""
        try:
            parents = self.parents(merge)
            if len(parents) != 2:
                return []
            if via in parents:
                other = parents[1] if via == parents[0] else parents[0]
            else:
                beyond = [p for p in parents if not self.holds(via, p)]
                if len(beyond) != 1:
                    return []
                other = beyond[0]
            line = self._git.output("rev-list", "--reverse", "--first-parent", other, "--not", via)
        except (BadInput, GitFailed):
            return []
        return line.split()

    def holds(self, commit: str, ancestor: str) -> bool:
        """Whether `ancestor` is in the history of `commit` (the commit itself included)."""
        return self._git.succeeds("merge-base", "--is-ancestor", ancestor, commit)

    def merge_base(self, one: str, other: str) -> str | None:
        try:
            return self._git.output("merge-base", one, other).strip() or None
        except GitFailed:
            return None

    def classify(self, commit: str, path: str = "runtime") -> Change:
        """What `commit` did to the gitlink at `path` and to everything else.

        `.gitmodules` does not count as code: it says where a submodule lives, not what is built,
        so a bump that also edits it is still pointer-only.
        """
        sha = self.resolve(commit)
        parent = self.parent(sha)
        old = self.gitlink(parent, path) if parent else None
        new = self.gitlink(sha, path)
        span = [parent, sha] if parent else ["--root", sha]
        diffed = self._git.output(
            "diff-tree", "-r", "-z", "--no-commit-id", "--no-renames", "--name-only", *span, "--"
        )
        changed = tuple(sorted(p for p in diffed.split("\0") if p and p != path))
        if old == new:
            kind: ChangeKind = "unchanged"
        elif set(changed) <= METADATA_PATHS:
            kind = "pointer-only"
        else:
            kind = "pointer-and-code"
        return Change(sha, parent, old, new, kind, changed)


def pointer_states(
    submodule_repo: Path | str, old: str | None, new: str | None
) -> tuple[Direction, list[str]]:
    """The submodule states a bump walks through, `old` first and `new` last.

    Bisecting inside a bump means building the parent's pypto against each of these in turn, so
    the order must be the one in which the pointer could have been moved: along first parents
    forward, back along first parents for a backward bump, and via the merge base when the two
    pointers diverged. A pointer that appears or disappears has nothing in between.
    """
    if new is None:
        if old is None:
            raise ValueError("pointer_states needs at least one pointer")
        return "removed", [old]
    if old is None:
        return "added", [new]
    if old == new:
        raise ValueError(f"the pointer did not move ({old[:12]})")
    runner = Git(Path(submodule_repo))
    for sha in (old, new):
        if not _has_commit(runner, sha):
            raise SourceUnavailable(
                f"submodule commit {sha[:12]} is not in {submodule_repo}: run "
                "`git submodule update --init --recursive` where the upstream is reachable, or "
                "give a mirror that has it"
            )
    if runner.succeeds("merge-base", "--is-ancestor", old, new):
        return "forward", _forward(runner, old, new)
    if runner.succeeds("merge-base", "--is-ancestor", new, old):
        return "backward", _forward(runner, new, old)[::-1]
    if runner.output("rev-parse", "--is-shallow-repository").strip() == "true":
        raise SourceUnavailable(
            f"the submodule history between {old[:12]} and {new[:12]} is cut off: the checkout "
            "holds a shallow clone of it; fetch the rest there (`git fetch --unshallow` in the "
            "submodule) or pass --simpler DIR with a full clone"
        )
    try:
        base = runner.output("merge-base", old, new).strip()
    except GitFailed:
        raise BisectError(
            f"submodule commits {old[:12]} and {new[:12]} share no history (the runtime was "
            "replaced by another repository, or its history rewritten): no simpler commit can be "
            "named, only the pypto commit that switched"
        ) from None
    return "diverged", _forward(runner, base, old)[::-1] + _forward(runner, base, new)[1:]


def _forward(runner: Git, start: str, end: str) -> list[str]:
    """start, then the commits leading to end, oldest first (start is an ancestor of end)."""
    chain = _first_parent_chain(runner, end, start)
    if chain is None:
        chain = runner.output(
            "rev-list", "--ancestry-path", "--topo-order", end, f"^{start}"
        ).split()
    return [start, *chain[::-1]]
