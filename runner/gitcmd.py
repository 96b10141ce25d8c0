"""Every git command the tool runs, and the one reader of git's gitlink listings.

Two kinds of repository are read: the user's (the pypto checkout, its module dirs, a `--simpler`
clone), which must not change at all, and the tool's own bare mirrors. Both go through `run`,
whose environments drop inherited repository pointers (GIT_DIR from a git hook, say) and turn
optional locks off so git never refreshes the user's index; the mirrors' environment also drops
the user's and the system's config, so an export does not depend on settings like core.autocrlf.
`history.py` asks questions of one repository through `Git`; `sources.py` drives the mirrors.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.errors import BadInput, InfrastructureError

GITLINK_MODE = "160000"

# Variables that would point git at some other repository than the one we name explicitly
# (set e.g. when the tool runs inside a git hook).
_REPO_LOCAL_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_GRAFT_FILE",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_INTERNAL_SUPER_PREFIX",
)


def _base_env(*, isolated: bool) -> dict[str, str]:
    """Environment for git: no inherited repo pointers, no optional locks (no index refreshes).

    `isolated` also drops the user's global/system config so exports do not depend on settings
    such as core.autocrlf; it is used for the tool's own mirrors only, because reading the user's
    repo may need their safe.directory settings.
    """
    env = {k: v for k, v in os.environ.items() if k not in _REPO_LOCAL_ENV}
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANG="C")
    if isolated:
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    return env


USER_ENV = _base_env(isolated=False)
MIRROR_ENV = _base_env(isolated=True)


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] = USER_ENV,
    cwd: Path | None = None,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """`git <args>`, its output captured; the exit status is the caller's to judge."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=dict(env), capture_output=True, check=False, input=stdin
        )
    except FileNotFoundError as exc:
        raise InfrastructureError(
            "git is not installed or not on PATH; install git and rerun"
        ) from exc


def checked(proc: subprocess.CompletedProcess[bytes], what: str) -> bytes:
    """The output of a git command that should not fail (mostly on the tool's own mirrors)."""
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        raise InfrastructureError(
            f"git failed while {what}: {detail[-1] if detail else f'exit {proc.returncode}'}; "
            "check disk space and permissions of the cache directory"
        )
    return proc.stdout


class GitFailed(Exception):
    """A git command of `Git` exited non-zero; callers decide what that means for the user."""

    def __init__(self, args: Sequence[str], status: int, stderr: str) -> None:
        super().__init__(f"git {' '.join(args)} exited {status}: {stderr.strip()}")
        self.status = status
        self.stderr = stderr


class Git:
    """Read-only git commands in one repository: a work tree, a bare repository or a module git
    dir (.git/modules/<name>).

    Discovery is fenced at the repository so a directory inside some other repository is not
    mistaken for one; git dirs are given as GIT_DIR because a module dir's core.worktree may
    point nowhere.
    """

    def __init__(self, path: Path) -> None:
        path = Path(path).resolve()
        if not path.is_dir():
            raise BadInput(f"not a git repository: {path}")
        self.path = path
        self._env = {**USER_ENV, "GIT_CEILING_DIRECTORIES": str(path.parent)}
        if not (path / ".git").exists() and (path / "HEAD").is_file():
            self._env["GIT_DIR"] = str(path)
        try:
            self.output("rev-parse", "--git-dir")
        except GitFailed as failed:
            if "dubious ownership" in failed.stderr:
                raise BadInput(
                    f"git refuses {path}: another user owns it (dubious ownership); run as its "
                    f"owner, or trust it with git config --global --add safe.directory {path}"
                ) from None
            inside = run(["rev-parse", "--show-toplevel"], env=USER_ENV, cwd=path)
            if inside.returncode == 0 and inside.stdout.strip():
                top = inside.stdout.decode(errors="surrogateescape").strip()
                raise BadInput(
                    f"{path} is not the top of a git checkout (it lies inside {top}); pass the "
                    "root of the checkout"
                ) from None
            raise BadInput(f"not a git repository: {path}") from None

    def output(self, *args: str) -> str:
        """The command's output, less its final newline; GitFailed when it exits non-zero."""
        proc = run(args, env=self._env, cwd=self.path)
        if proc.returncode != 0:
            raise GitFailed(args, proc.returncode, proc.stderr.decode(errors="replace"))
        out = proc.stdout.removesuffix(b"\n")
        return out.decode(errors="surrogateescape")

    def succeeds(self, *args: str) -> bool:
        """A yes/no command (exit 0 yes, 1 no); any other exit is a real failure (GitFailed)."""
        try:
            self.output(*args)
        except GitFailed as error:
            if error.status == 1:
                return False
            raise
        return True


def git_dir_of(location: Path) -> Path | None:
    """The git dir behind a work tree, a `.git` file/dir or a bare repo, if there is one."""
    try:
        dot_git = location / ".git"
        if dot_git.is_file():
            text = dot_git.read_text(errors="replace").strip()
            if not text.startswith("gitdir:"):
                return None
            target = Path(text[len("gitdir:") :].strip())
            candidate = target if target.is_absolute() else location / target
        elif dot_git.is_dir():
            candidate = dot_git
        else:
            candidate = location
        if (candidate / "HEAD").exists() and objects_dir(candidate).is_dir():
            return Path(os.path.normpath(candidate.absolute()))
    except OSError:
        return None
    return None


def objects_dir(git_dir: Path) -> Path:
    """Where a git dir keeps its objects (a linked worktree's are in the common dir)."""
    commondir = git_dir / "commondir"
    if commondir.is_file():
        common = Path(commondir.read_text().strip())
        git_dir = common if common.is_absolute() else git_dir / common
    return Path(os.path.normpath((git_dir / "objects").absolute()))


def gitlinks(listing: str | bytes, *, tree_format: bool = False) -> Iterator[tuple[str, str]]:
    """(path, pinned sha) of each gitlink in `ls-files --stage -z` (or `ls-tree -z`) output."""
    if isinstance(listing, bytes):
        listing = listing.decode(errors="surrogateescape")
    for record in listing.split("\0"):
        if not record.startswith(GITLINK_MODE):
            continue
        meta, _, path = record.partition("\t")
        parts = meta.split()
        yield path, parts[2] if tree_format else parts[1]


def moved_gitlinks(raw_log: str, path: str) -> dict[str, str | None]:
    """What each commit of `log --raw --no-abbrev --format=%x00%H -- <path>` output set the
    gitlink at `path` to: its new sha, or None when the commit made `path` something else."""
    moved: dict[str, str | None] = {}
    for block in raw_log.split("\0")[1:]:
        sha, *raw = block.strip().splitlines()
        for line in raw:
            meta, _, name = line.partition("\t")
            fields = meta.split()
            if name == path and len(fields) >= 4:
                moved[sha.strip()] = fields[3] if fields[1] == GITLINK_MODE else None
    return moved


@dataclass(frozen=True)
class SubmoduleEntry:
    """One `.gitmodules` entry."""

    name: str
    path: str
    url: str | None


def parse_gitmodules(raw: bytes) -> dict[str, SubmoduleEntry]:
    """`git config -l -z` output of a .gitmodules blob -> entries keyed by path."""
    fields: dict[str, dict[str, str]] = {}
    for item in raw.split(b"\0"):
        if not item:
            continue
        key, _, value = item.decode(errors="surrogateescape").partition("\n")
        if not key.startswith("submodule."):
            continue
        name, _, var = key[len("submodule.") :].rpartition(".")
        if name:
            fields.setdefault(name, {})[var] = value
    entries: dict[str, SubmoduleEntry] = {}
    for name, values in fields.items():
        path = values.get("path")
        if path:
            path = path.strip("/")
            entries[path] = SubmoduleEntry(name=name, path=path, url=values.get("url"))
    return entries
