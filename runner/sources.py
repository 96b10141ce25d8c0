"""Export a pypto commit's complete source tree, every submodule included, for a builder container.

The user's checkout is their working state and must not change at all (HEAD, index, work tree,
`.git/config`, `.git/modules/*`), and NPU hosts often cannot reach the upstream URLs. So every
repository in the submodule tree (the superproject and each submodule, keyed by its *name*, which
stays stable while URLs and sometimes paths change) gets a bare mirror in the cache whose
`objects/info/alternates` lists the user's local object directories. That copies nothing, sees
every local object (including ones the user fetches later) and never writes to the user's repos.

The export itself is `git read-tree` into a throwaway index plus `git checkout-index` against a
mirror: it keeps exec bits and symlinks, ignores `export-ignore`, and needs no work tree of the
user's. Gitlinks are then resolved through `.gitmodules` *at that commit* and exported recursively.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from subprocess import CompletedProcess
from types import MappingProxyType
from urllib.parse import quote, unquote

from filelock import FileLock, Timeout

from runner.errors import BadInput, InfrastructureError, SourceUnavailable
from runner.gitcmd import (
    MIRROR_ENV,
    USER_ENV,
    SubmoduleEntry,
    checked,
    git_dir_of,
    gitlinks,
    objects_dir,
    parse_gitmodules,
    run,
)

LOCK_TIMEOUT_S = 600.0
_HEX = re.compile(r"[0-9a-fA-F]{4,64}")
_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_NO_OVERRIDES: Mapping[str, str | None] = MappingProxyType({})


@dataclass(frozen=True)
class ExportResult:
    """What one export produced; `submodules` maps each materialised path (from the
    superproject's root) to its exported sha."""

    commit: str
    dest: Path
    submodules: dict[str, str]
    seconds: float
    committed: int | None = None
    """The commit's committer time (seconds since the epoch): builds take it as their
    SOURCE_DATE_EPOCH, so a wheel rebuilt from the same sources is the same file."""


@dataclass(frozen=True)
class _Repo:
    """One repository of the submodule tree: its mirror and where the user keeps its objects.

    `names` is the chain of submodule names from the superproject (empty for the superproject),
    `git_dirs` the user's git dirs holding it, `worktrees` the user's checkout directories of it
    and `url_bases` the local directories its own relative submodule URLs are resolved against.
    """

    names: tuple[str, ...]
    display: str
    mirror: Path
    git_dirs: tuple[Path, ...]
    worktrees: tuple[Path, ...]
    url_bases: tuple[Path, ...]

    @property
    def modules_hint(self) -> str:
        return ".git/" + "/".join(f"modules/{name}" for name in self.names)


def _is_dir(path: Path) -> bool:
    """Like Path.is_dir, but a place this user may not look into is simply not there."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _local_url_paths(url: str | None, bases: Iterable[Path]) -> list[Path]:
    """Directories a submodule URL names on this machine; network URLs name none."""
    if not url:
        return []
    if url.startswith("file://"):
        return [Path(unquote(url[len("file://") :]))]
    if "://" in url:
        return []
    if url.startswith(("./", "../")):
        return [Path(os.path.normpath(base / url)) for base in bases]
    if os.path.isabs(url):
        return [Path(url)]
    return []


def _batch_objects(output: bytes, count: int) -> list[tuple[str, bytes] | None]:
    """`git cat-file --batch`'s answer to `count` names: (type, content), None for a missing one."""
    found: list[tuple[str, bytes] | None] = []
    at = 0
    for _ in range(count):
        end = output.index(b"\n", at)
        header = output[at:end].split()
        at = end + 1
        if len(header) != 3 or not header[2].isdigit():  # "<name> missing", "ambiguous"
            found.append(None)
            continue
        size = int(header[2])
        found.append((header[1].decode(), output[at : at + size]))
        at += size + 1
    return found


def _committed(commit: bytes, sha: str) -> datetime:
    """The committer date of a raw commit object, as `git show -s --format=%cI` gives it."""
    for line in commit.split(b"\n"):
        if not line:
            break  # the message follows the headers
        if line.startswith(b"committer "):
            stamp, zone = line.rsplit(b" ", 2)[1:]
            sign = -1 if zone.startswith(b"-") else 1
            offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5])) * sign
            return datetime.fromtimestamp(int(stamp), timezone(offset))
    raise InfrastructureError(f"git gave commit {sha[:12]} without a committer date")


class SourceExporter:
    """Exports commits of one superproject from tool-owned mirrors in `cache_dir/mirrors/`.

    Mirrors are kept per superproject (keyed by a hash of its absolute git dir) and per submodule
    name; only creating a mirror or adding an alternate takes the file lock, so several runs can
    share one cache.
    """

    def __init__(
        self,
        superproject: Path,
        cache_dir: Path,
        extra_repos: Mapping[str, Sequence[Path]] = MappingProxyType({}),
        runtime: str = "runtime",
    ) -> None:
        """`extra_repos`: submodule path -> other local clones with its objects (`--simpler`).
        `runtime`: the simpler submodule's path, which no build can do without."""
        self.superproject = Path(superproject).absolute()
        self._runtime = _norm(runtime)
        self._extra = {
            _norm(path): tuple(Path(repo).absolute() for repo in repos)
            for path, repos in extra_repos.items()
        }
        self._worktree, self._git_dir, self._common_dir = self._locate(self.superproject)
        key = hashlib.sha256(str(self._common_dir).encode()).hexdigest()[:16]
        self._root = Path(cache_dir).absolute() / "mirrors" / key
        self._lock_path = self._root.parent / f"{key}.lock"
        self._alternates: dict[Path, frozenset[Path]] = {}
        self._gitmodules_cache: dict[tuple[Path, str], dict[str, SubmoduleEntry]] = {}
        self._config_urls: dict[Path, dict[str, str]] = {}
        self._default_at: dict[str, str] = {}
        self._reads: dict[tuple[str, str], bool] = {}
        self._resolved: dict[str, str] = {}  # full SHA -> itself, once the checkout has it
        self._top = self._make_top()

    # ----------------------------------------------------------------- public API

    def export(
        self,
        commit: str,
        dest: Path,
        *,
        overrides: Mapping[str, str | None] = _NO_OVERRIDES,
        skip: Collection[str] = (),
    ) -> ExportResult:
        """Materialise `commit` with every submodule at its pinned (or overridden) sha.

        Skipped and `None`-overridden submodules are left as the empty directory git leaves for
        an uninitialised submodule.
        """
        started = time.perf_counter()
        sha = self._resolve_superproject_commit(commit)
        dest = self._prepare_dest(dest)
        wanted = {_norm(path): value for path, value in overrides.items()}
        skipped = {_norm(path) for path in skip}
        used: set[str] = set()
        submodules: dict[str, str] = {}
        try:
            self._ensure_mirror(self._top)
            self._require_commit(self._top, sha)
            self._materialise(self._top, sha, dest, "", wanted, skipped, used, submodules)
            left_out = skipped | {p for p, v in wanted.items() if v is None}
            unused = sorted(
                p
                for p, v in wanted.items()
                if v is not None and p not in used and not _beneath(p, left_out)
            )
            if unused:
                raise BadInput(
                    f"cannot override {', '.join(unused)}: commit {sha[:12]} has no submodule "
                    "there; check the submodule path (nested paths look like runtime/third_party/x)"
                )
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        committed = int(self._commit_date(self._top, sha).timestamp())
        return ExportResult(sha, dest, submodules, time.perf_counter() - started, committed)

    def export_submodule(
        self,
        path: str,
        commit: str,
        dest: Path,
        *,
        at: str | None = None,
        skip: Collection[str] = (),
    ) -> ExportResult:
        """Export the submodule at `path` standalone at `commit`, its own submodules included.

        Nested submodules keep their paths from the superproject (`runtime/third_party/x`), in
        `skip`, in messages and in the result, as in `export`: one name for one place.
        """
        started = time.perf_counter()
        path = _norm(path)
        at_sha = self._resolve_superproject_commit(at) if at else self._newest_with(path)
        repo = self._repo_for_path(path, at_sha)
        sha = self._resolve_in_mirror(repo, commit)
        dest = self._prepare_dest(dest)
        submodules: dict[str, str] = {}
        skipped = {_norm(p) for p in skip}
        try:
            self._materialise(repo, sha, dest, f"{path}/", {}, skipped, set(), submodules)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        committed = int(self._commit_date(repo, sha).timestamp())
        return ExportResult(sha, dest, submodules, time.perf_counter() - started, committed)

    def _commit_date(self, repo: _Repo, sha: str) -> datetime:
        """The committer date: what build tools are picked by, and the builds' SOURCE_DATE_EPOCH."""
        shown = self._mirror_git(repo, "cat-file", "commit", sha)
        return _committed(checked(shown, f"reading {sha[:12]}"), sha)

    def check(
        self,
        commit: str,
        *,
        overrides: Mapping[str, str | None] = _NO_OVERRIDES,
        skip: Collection[str] = (),
        omitted: set[str] | None = None,
    ) -> dict[str, str]:
        """Raise SourceUnavailable now if `export` would: every pinned commit, recursively.

        Cheap (no tree is written), so an attempt can refuse a commit before building anything.
        `omitted` collects the paths of `skip` that this commit has a submodule at.
        """
        sha = self._resolve_superproject_commit(commit)
        wanted = {_norm(path): value for path, value in overrides.items()}
        skipped = {_norm(p) for p in skip}
        submodules: dict[str, str] = {}
        used: set[str] = set()
        missing: list[tuple[_Repo, str]] = []
        self._ensure_mirror(self._top)
        self._require_commit(self._top, sha)
        self._materialise(self._top, sha, None, "", wanted, skipped, used, submodules, missing)
        if missing:  # every one at once: a user fetching them should not learn them one by one
            raise self._all_unavailable(missing)
        if omitted is not None:
            omitted.update(used & skipped)
        return submodules

    def pinned(self, commit: str, path: str) -> str | None:
        """The commit the superproject's gitlink at `path` pins at `commit`, or None (no
        gitlink there; a path inside another submodule is not looked up)."""
        sha = self._resolve_superproject_commit(commit)
        self._ensure_mirror(self._top)
        listing = self._mirror_git(self._top, "ls-tree", "-z", sha, "--", _norm(path))
        return dict(gitlinks(listing.stdout, tree_format=True)).get(_norm(path))

    def reads_submodule(self, commit: str, path: str) -> bool:
        """Whether the build of `commit` may read the submodule at `path`: a build file names
        it as a path from the project's root (`${CMAKE_SOURCE_DIR}/runtime/include`,
        `add_subdirectory(runtime)`, `"runtime/x.h"` in setup.py), a C/C++ source includes a
        file from it, or a tracked symlink points into it (`pypto/_rt.py ->
        ../runtime/rt/__init__.py`). Such a build puts the submodule's files into the wheel."""
        sha = self._resolve_superproject_commit(commit)
        cached = self._reads.get((sha, path))
        if cached is not None:
            return cached
        self._ensure_mirror(self._top)
        name = _ere_escape(_norm(path))
        searches = (
            (rf"""(^|[[:space:]"'(=]|}}/|\./){name}([/"')[:space:]]|$)""", _BUILD_FILES),
            (rf"""#[[:space:]]*include[[:space:]]*[<"](\.\./)*{name}/""", _C_SOURCES),
        )
        found = False
        for pattern, pathspecs in searches:
            proc = self._mirror_git(
                self._top, "grep", "-q", "-I", "-E", "-e", pattern, sha, "--", *pathspecs
            )
            if proc.returncode not in (0, 1):
                checked(proc, f"searching {sha[:12]}")
            if proc.returncode == 0:
                found = True
                break
        found = found or self._links_into(sha, _norm(path))
        self._reads[(sha, path)] = found
        return found

    def _links_into(self, sha: str, path: str) -> bool:
        """Whether a symlink that `sha` tracks outside `path` points into `path` (relative
        targets only: an absolute one names the build machine's files, not the checkout's)."""
        listed = checked(self._mirror_git(self._top, "ls-tree", "-r", "-z", sha), f"listing {sha}")
        links = [
            (meta.split()[2], name.decode(errors="surrogateescape"))
            for meta, _, name in (entry.partition(b"\t") for entry in listed.split(b"\0"))
            if meta.startswith(b"120000 ")
        ]
        links = [(oid, name) for oid, name in links if not _within(name, path)]
        if not links:
            return False
        asked = b"".join(oid + b"\n" for oid, _ in links)
        proc = self._mirror_git(self._top, "cat-file", "--batch", stdin=asked)
        targets = _batch_objects(checked(proc, f"reading the symlinks of {sha[:12]}"), len(links))
        for (_, name), found in zip(links, targets, strict=True):
            target = found[1].decode(errors="surrogateescape") if found is not None else "/"
            if target.startswith("/"):
                continue
            if _within(posixpath.normpath(posixpath.join(posixpath.dirname(name), target)), path):
                return True
        return False

    def changed(self, first: str, last: str, filename: str) -> list[str]:
        """First-parent commits in first..last that change `filename` (newest first)."""
        self._ensure_mirror(self._top)
        proc = self._mirror_git(
            self._top, "rev-list", "--first-parent", f"{first}..{last}", "--", filename
        )
        return proc.stdout.decode().split() if proc.returncode == 0 else []

    def read(
        self, commit: str, filename: str, *, submodule: str | None = None, at: str | None = None
    ) -> tuple[str | None, datetime]:
        """A file's text at `commit` (None when absent) and the commit's committer date.

        `submodule`: read from the submodule at that path (as of superproject commit `at`).
        """
        texts, when = self.read_files(commit, (filename,), submodule=submodule, at=at)
        return texts[filename], when

    def read_files(
        self,
        commit: str,
        filenames: Sequence[str],
        *,
        submodule: str | None = None,
        at: str | None = None,
    ) -> tuple[dict[str, str | None], datetime]:
        """`read` of several files of one commit, which is resolved and dated once."""
        if submodule is None:
            repo = self._top
            self._ensure_mirror(repo)
            sha = self._resolve_superproject_commit(commit)
        else:
            path = _norm(submodule)
            at_sha = self._resolve_superproject_commit(at) if at else self._newest_with(path)
            repo = self._repo_for_path(path, at_sha)
            sha = self._resolve_in_mirror(repo, commit)
        # The commit and the files in one git call: planning reads every commit that edits
        # pyproject.toml, thousands in a long range.
        names = [f"{sha}^{{commit}}", *(f"{sha}:{filename}" for filename in filenames)]
        shown = self._mirror_git(
            repo, "cat-file", "--batch", stdin="".join(f"{n}\n" for n in names).encode()
        )
        objects = _batch_objects(checked(shown, f"reading {sha[:12]}"), len(names))
        if objects[0] is None or objects[0][0] != "commit":
            raise self._unavailable(repo, sha)
        texts = {
            filename: found[1].decode(errors="replace")
            if found is not None and found[0] == "blob"
            else None
            for filename, found in zip(filenames, objects[1:], strict=True)
        }
        return texts, _committed(objects[0][1], sha)

    def submodule_git_dir(self, path: str) -> Path:
        """A git dir (the tool's mirror) that sees every local object of the submodule at `path`.

        It has no refs: address commits by sha (e.g. `git rev-list <old>..<new>`).
        """
        path = _norm(path)
        return self._repo_for_path(path, self._newest_with(path)).mirror

    # ----------------------------------------------------------------- locating repositories

    @staticmethod
    def _locate(path: Path) -> tuple[Path | None, Path, Path]:
        if not path.is_dir():
            raise BadInput(f"{path} does not exist or is not a directory; pass the pypto checkout")
        proc = run(
            ["rev-parse", "--is-bare-repository", "--absolute-git-dir", "--git-common-dir"],
            env=USER_ENV,
            cwd=path,
        )
        if proc.returncode != 0:
            detail = proc.stderr.decode(errors="replace").strip().splitlines()
            raise BadInput(
                f"{path} is not a git repository ({detail[-1] if detail else 'git failed'}); "
                "pass the root of the pypto checkout"
            )
        bare, git_dir, common = proc.stdout.decode().splitlines()[:3]
        git_path = Path(git_dir)
        common_path = Path(common) if os.path.isabs(common) else path / common
        common_path = Path(os.path.normpath(common_path.absolute()))
        if bare == "true":
            if path.resolve() != git_path.resolve():
                raise BadInput(f"{path} is inside the bare repository {git_path}; pass that")
            return None, git_path, common_path
        top = run(["rev-parse", "--show-toplevel"], env=USER_ENV, cwd=path)
        if top.returncode != 0:  # a checkout's .git directory: neither bare nor a work tree
            raise BadInput(
                f"{path} is the git directory of a checkout, not the checkout; pass the root "
                "of the pypto checkout"
            )
        toplevel = Path(top.stdout.decode().strip())
        if toplevel.resolve() != path.resolve():
            raise BadInput(
                f"{path} is not the top of a git checkout (it lies inside {toplevel}); "
                "pass the root of the pypto checkout"
            )
        return path, git_path, common_path

    def _make_top(self) -> _Repo:
        bases = [self._worktree] if self._worktree else [self._git_dir]
        for url in self._user_config_urls(self._common_dir, prefix="remote.").values():
            bases.extend(_local_url_paths(url, [self._worktree or self._git_dir]))
        return _Repo(
            names=(),
            display=str(self.superproject),
            mirror=self._root / "superproject.git",
            git_dirs=(self._common_dir,),
            worktrees=(self._worktree,) if self._worktree else (),
            url_bases=tuple(dict.fromkeys(bases)),
        )

    def _child(self, parent: _Repo, entry: SubmoduleEntry, display: str) -> _Repo:
        """Every local place the submodule `entry` of `parent` may keep its objects."""
        worktrees = [w / entry.path for w in parent.worktrees if _is_dir(w / entry.path)]
        urls = [entry.url]
        urls += [
            cfg.get(entry.name)
            for cfg in (self._user_config_urls(g, prefix="submodule.") for g in parent.git_dirs)
        ]
        url_dirs: list[Path] = []
        for url in dict.fromkeys(u for u in urls if u):
            url_dirs.extend(p for p in _local_url_paths(url, parent.url_bases) if _is_dir(p))
        locations = [g / "modules" / entry.name for g in parent.git_dirs]
        locations += worktrees + url_dirs
        locations += self._extra.get(display, ())
        # Last resort, after the stores named for this submodule: every other module store of the
        # parent, since a submodule renamed in .gitmodules keeps its objects under the old name.
        locations += [
            m
            for g in parent.git_dirs
            if _is_dir(g / "modules")
            for m in sorted((g / "modules").glob("*"))
        ]
        git_dirs = [g for g in (git_dir_of(loc) for loc in locations) if g is not None]
        base = parent.mirror.parent if parent.names else self._root
        mirror = base / "modules" / _quote(entry.name) / "mirror.git"
        return _Repo(
            names=(*parent.names, entry.name),
            display=display,
            mirror=mirror,
            git_dirs=tuple(dict.fromkeys(git_dirs)),
            worktrees=tuple(worktrees),
            url_bases=tuple(dict.fromkeys([*url_dirs, *worktrees])),
        )

    def _user_config_urls(self, git_dir: Path, *, prefix: str) -> dict[str, str]:
        """`<prefix><name>.url` values from a user's git config file (read, never written)."""
        cache_key = git_dir / prefix
        cached = self._config_urls.get(cache_key)
        if cached is not None:
            return cached
        urls: dict[str, str] = {}
        config = git_dir / "config"
        if config.is_file():
            pattern = "^" + re.escape(prefix) + r".*\.url$"
            proc = run(
                ["config", "--file", str(config), "-z", "--get-regexp", pattern], env=MIRROR_ENV
            )
            for item in proc.stdout.split(b"\0"):
                key, _, value = item.decode(errors="surrogateescape").partition("\n")
                if key:
                    urls[key[len(prefix) : -len(".url")]] = value
        self._config_urls[cache_key] = urls
        return urls

    # ----------------------------------------------------------------- mirrors

    def _ensure_mirror(self, repo: _Repo) -> None:
        """Create the mirror and add any newly found user object dirs to its alternates."""
        wanted = frozenset(objects_dir(g) for g in repo.git_dirs)
        known = self._alternates.get(repo.mirror)
        if known is not None and wanted <= known:
            return
        self._root.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(self._lock_path), timeout=LOCK_TIMEOUT_S):
                if not (repo.mirror / "HEAD").exists():
                    checked(
                        run(
                            ["init", "--bare", "--quiet", "--template=", str(repo.mirror)],
                            env=MIRROR_ENV,
                        ),
                        f"creating the mirror {repo.mirror}",
                    )
                    if not repo.names:
                        (self._root / "superproject.txt").write_text(f"{self._common_dir}\n")
                info = repo.mirror / "objects" / "info"
                info.mkdir(parents=True, exist_ok=True)
                alternates = info / "alternates"
                listed = alternates.read_text().splitlines() if alternates.exists() else []
                current = {Path(line) for line in listed if line.strip()}
                merged = {p for p in current | wanted if _is_dir(p)}
                if merged != current:
                    tmp = info / f"alternates.{os.getpid()}.tmp"
                    tmp.write_text("".join(f"{p}\n" for p in sorted(merged)))
                    os.replace(tmp, alternates)
                self._mark_shallow(repo)
                self._alternates[repo.mirror] = frozenset(merged)
        except Timeout as exc:
            raise InfrastructureError(
                f"the mirror cache {self._root} stayed locked for {LOCK_TIMEOUT_S:.0f}s by another "
                f"run; wait for it or remove {self._lock_path} if no run is active"
            ) from exc
        except OSError as exc:
            raise InfrastructureError(
                f"cannot update the mirror cache {self._root}: {exc}; check disk space and "
                "permissions of the cache directory"
            ) from exc

    def _mark_shallow(self, repo: _Repo) -> None:
        """Tell the mirror where a shallow clone of the user's cut the history off.

        A commit fetched with --depth has parents no object store holds; the user's git knows
        from its `shallow` file, the mirror (which borrows only the objects) would fail to read
        the commit at all. The mirror lists the commits whose parents none of its sources has,
        so a shallow pin still exports, while walking the history past it shows it as cut.
        """
        listed = _shallow_cuts(repo)
        cut = sorted(sha for sha in listed if self._parents_missing(repo, sha))
        target = repo.mirror / "shallow"
        if not cut:
            target.unlink(missing_ok=True)
            return
        tmp = repo.mirror / f"shallow.{os.getpid()}.tmp"
        tmp.write_text("".join(f"{sha}\n" for sha in cut))
        os.replace(tmp, target)

    def _parents_missing(self, repo: _Repo, sha: str) -> bool:
        """Whether `sha` is a commit here some of whose parents no source holds."""
        shown = self._mirror_git(repo, "cat-file", "commit", sha)
        if shown.returncode != 0:
            return False
        header = shown.stdout.split(b"\n\n", 1)[0].decode(errors="replace").splitlines()
        parents = [line.split()[1] for line in header if line.startswith("parent ")]
        return any(
            self._mirror_git(repo, "cat-file", "-e", f"{parent}^{{commit}}").returncode != 0
            for parent in parents
        )

    def _mirror_git(
        self, repo: _Repo, *args: str, stdin: bytes | None = None, **env: str
    ) -> CompletedProcess[bytes]:
        return run(["--git-dir", str(repo.mirror), *args], env={**MIRROR_ENV, **env}, stdin=stdin)

    def _unavailable(self, repo: _Repo, sha: str) -> SourceUnavailable:
        if not repo.names:
            return SourceUnavailable(
                f"source unavailable: {repo.display} commit {sha[:12]} is not in the local "
                "checkout or its submodules; fetch it there and rerun"
            )
        given = self._extra.get(repo.display)
        if given:  # the clones named for it (--submodule-source, --simpler) lack it too
            clones = " or ".join(str(clone) for clone in given)
            return SourceUnavailable(
                f"source unavailable: submodule {repo.display} commit {sha[:12]} is neither in "
                f"the local checkout ({repo.modules_hint}) nor in {clones}, the "
                f"{'clone' if len(given) == 1 else 'clones'} given for it; fetch it into one "
                "of them, or give a clone that has it"
                + (
                    ""
                    if repo.display == self._runtime
                    else f", or --omit-submodule {repo.display} if the build does not need it"
                ),
                submodule=repo.display,
            )
        if repo.display == self._runtime:
            how = "pass --simpler DIR with a clone that has it"
        else:
            how = (
                f"pass --submodule-source {repo.display}=DIR with a clone that has it, or "
                f"--omit-submodule {repo.display} if the build does not need it"
            )
        # `git clone --shallow-submodules` (or a depth-limited `submodule update`) cuts the
        # submodule's history off: the fix is to deepen it, not to find another clone.
        fetch = (
            f"it is a shallow clone: `git -C {repo.display} fetch --unshallow` completes it, or "
            if _shallow_cuts(repo)
            else "fetch it there, "
        )
        return SourceUnavailable(
            f"source unavailable: submodule {repo.display} commit {sha[:12]} is not in the local "
            f"checkout ({repo.modules_hint}); {fetch}{how}",
            submodule=repo.display,
        )

    def _all_unavailable(self, missing: Sequence[tuple[_Repo, str]]) -> SourceUnavailable:
        """One error naming every missing submodule commit, each with where it was looked for."""
        if len(missing) == 1:
            return self._unavailable(*missing[0])
        named = []
        for repo, sha in missing:
            where = " or ".join([repo.modules_hint, *map(str, self._extra.get(repo.display, ()))])
            named.append(f"{repo.display} commit {sha[:12]} (not in {where})")
        return SourceUnavailable(
            f"source unavailable: {len(missing)} submodule commits are not in the local "
            f"checkout: {'; '.join(named)}; fetch each there, or pass a clone that has it "
            f"(--simpler DIR for {self._runtime}, --submodule-source PATH=DIR for another, "
            "which --omit-submodule PATH leaves out if the build does not need it)",
            submodule=missing[0][0].display,
        )

    def _require_commit(self, repo: _Repo, sha: str) -> None:
        proc = self._mirror_git(repo, "cat-file", "-e", f"{sha}^{{commit}}")
        if proc.returncode != 0:
            raise self._unavailable(repo, sha)

    def _resolve_in_mirror(self, repo: _Repo, rev: str) -> str:
        """A submodule commit given as (possibly abbreviated) sha -> full sha, or unavailable."""
        self._ensure_mirror(repo)
        proc = self._mirror_git(
            repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"
        )
        if proc.returncode != 0:
            raise self._unavailable(repo, rev)
        return proc.stdout.decode().strip()

    def _resolve_superproject_commit(self, rev: str) -> str:
        """Names (HEAD, branches, tags) are resolved in the user's repo, read-only; a full SHA
        once (planning asks about the same commits again and again)."""
        known = self._resolved.get(rev)
        if known is not None:
            return known
        sha = self._resolve_in_checkout(rev)
        if _FULL_SHA.fullmatch(rev):
            self._resolved[rev] = sha
        return sha

    def _resolve_in_checkout(self, rev: str) -> str:
        proc = run(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
            env=USER_ENV,
            cwd=self._worktree or self._git_dir,
        )
        if proc.returncode == 0:
            return proc.stdout.decode().strip()
        if _HEX.fullmatch(rev):
            raise self._unavailable(self._top, rev)
        raise BadInput(
            f"unknown revision {rev!r} in {self.superproject}; give a commit sha, branch or tag "
            "that exists there"
        )

    # ----------------------------------------------------------------- export

    @staticmethod
    def _prepare_dest(dest: Path) -> Path:
        dest = Path(os.path.normpath(Path(dest).absolute()))
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise BadInput(f"export destination {dest} exists and is not empty; remove it first")
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InfrastructureError(f"cannot create {dest}: {exc}") from exc
        return dest

    def _materialise(
        self,
        repo: _Repo,
        sha: str,
        dest: Path | None,
        prefix: str,
        overrides: Mapping[str, str | None],
        skip: set[str],
        used: set[str],
        submodules: dict[str, str],
        missing: list[tuple[_Repo, str]] | None = None,
    ) -> None:
        """Write (or, without `dest`, walk) `sha`'s tree and its submodules'. With `missing`,
        a submodule commit no local store has is collected there and not walked into; without
        it, it raises SourceUnavailable."""
        gitlinks = self._checkout(repo, sha, dest) if dest is not None else self._listed(repo, sha)
        if not gitlinks:
            return
        entries = self._gitmodules(repo, sha)
        for path, pinned in gitlinks:
            full = prefix + path
            if full in skip:
                used.add(full)
                continue
            entry = entries.get(path) or self._unnamed(repo, path)
            child = self._child(repo, entry, full)
            if full in overrides:
                used.add(full)
                override = overrides[full]
                if override is None:
                    continue
                wanted = override
            else:
                wanted = pinned
            try:
                target = self._resolve_in_mirror(child, wanted)
            except SourceUnavailable:
                if missing is None:
                    raise
                missing.append((child, wanted))
                continue
            submodules[full] = target
            self._materialise(
                child,
                target,
                dest / path if dest is not None else None,
                f"{full}/",
                overrides,
                skip,
                used,
                submodules,
                missing,
            )

    def _checkout(self, repo: _Repo, sha: str, dest: Path) -> list[tuple[str, str]]:
        """Write the tree of `sha` into `dest`; return its gitlinks as (path, pinned sha)."""
        with tempfile.TemporaryDirectory(prefix="bisect-export-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            checked(self._mirror_git(repo, "read-tree", sha, **env), f"reading {sha[:12]}")
            written = run(
                # Parallel workers (one per core) roughly halve big exports on slow disks.
                [
                    *("--git-dir", str(repo.mirror), "-c", "checkout.workers=0"),
                    *("checkout-index", "--all", "--force"),
                ],
                env={**MIRROR_ENV, **env, "GIT_WORK_TREE": str(dest)},
                cwd=dest,
            )
            if written.returncode != 0 and self._partial_clone(repo):
                raise BadInput(
                    f"{repo.display} is a partial clone (git clone --filter) and lacks files of "
                    f"{sha[:12]}: the tool reads every commit offline from the checkout; use a "
                    "full clone"
                )
            checked(written, f"writing {sha[:12]} to {dest}")
            listing = checked(
                self._mirror_git(repo, "ls-files", "--stage", "-z", **env),
                f"listing {sha[:12]}",
            )
        return list(gitlinks(listing))

    @staticmethod
    def _partial_clone(repo: _Repo) -> bool:
        """Whether a store the repository borrows from was cloned with --filter (a promisor
        remote): its missing files are an input's fault, not the machine's."""
        for git_dir in repo.git_dirs:
            env = {**USER_ENV, "GIT_DIR": str(git_dir)}
            for key in ("extensions.partialclone", r"^remote\..*\.promisor$"):
                found = run(["config", "--get-regexp", key], env=env)
                if found.returncode == 0 and b"false" not in found.stdout.split()[1:2]:
                    return True
        return False

    def _listed(self, repo: _Repo, sha: str) -> list[tuple[str, str]]:
        """The gitlinks of `sha` without writing its tree anywhere."""
        listing = checked(self._mirror_git(repo, "ls-tree", "-r", "-z", sha), f"listing {sha[:12]}")
        return list(gitlinks(listing, tree_format=True))

    def _gitmodules(self, repo: _Repo, sha: str) -> dict[str, SubmoduleEntry]:
        key = (repo.mirror, sha)
        cached = self._gitmodules_cache.get(key)
        if cached is None:
            proc = self._mirror_git(repo, "config", "--blob", f"{sha}:.gitmodules", "-l", "-z")
            cached = parse_gitmodules(proc.stdout) if proc.returncode == 0 else {}
            self._gitmodules_cache[key] = cached
        return cached

    # ----------------------------------------------------------------- submodules by path

    def _repo_for_path(self, path: str, at_sha: str) -> _Repo:
        """Walk `.gitmodules` (and gitlinks, for nested paths) at superproject commit `at_sha`."""
        repo, sha, remaining, walked = self._top, at_sha, path, ""
        self._ensure_mirror(repo)
        while True:
            entries = self._gitmodules(repo, sha)
            match = max(
                (p for p in entries if _within(remaining, p)),
                key=len,
                default=None,
            )
            if match is None:  # a gitlink .gitmodules does not name (git itself warns, no more)
                linked = [p for p, _ in self._listed(repo, sha)]
                match = max(
                    (p for p in linked if _within(remaining, p)),
                    key=len,
                    default=None,
                )
                if match is None:
                    raise BadInput(
                        f"{path} is not a submodule at superproject commit {at_sha[:12]} "
                        "(no gitlink or .gitmodules entry has that path); check the path or pass "
                        "another commit"
                    )
                entries = {match: self._unnamed(repo, match)}
            walked = f"{walked}/{match}" if walked else match
            child = self._child(repo, entries[match], walked)
            self._ensure_mirror(child)
            if remaining == match:
                return child
            listing = checked(
                self._mirror_git(repo, "ls-tree", "-z", sha, "--", match), f"reading {sha[:12]}"
            )
            pinned = dict(gitlinks(listing, tree_format=True)).get(match)
            if pinned is None:
                raise BadInput(f"{walked} is not a submodule at superproject commit {at_sha[:12]}")
            self._require_commit(child, pinned)
            repo, sha, remaining = child, pinned, remaining[len(match) + 1 :]

    def _unnamed(self, repo: _Repo, path: str) -> SubmoduleEntry:
        """The entry of a gitlink that `.gitmodules` does not name at its commit (a commit
        that dropped or broke the file): the newest entry the superproject's history gives
        that path, so its objects are looked for under the same name; else the path as name."""
        if repo is self._top:
            entry = self._gitmodules(repo, self._newest_with(path)).get(path)
            if entry is not None:
                return entry
        return SubmoduleEntry(name=path, path=path, url=None)

    def _newest_with(self, path: str) -> str:
        """The newest superproject commit (from HEAD) whose .gitmodules names `path`'s submodule."""
        cached = self._default_at.get(path)
        if cached is not None:
            return cached
        head = self._resolve_superproject_commit("HEAD")
        self._ensure_mirror(self._top)
        found = head
        proc = self._mirror_git(self._top, "rev-list", head, "--", ".gitmodules")
        for candidate in [head, *proc.stdout.decode().split()]:
            entries = self._gitmodules(self._top, candidate)
            if any(_within(path, p) for p in entries):
                found = candidate
                break
        self._default_at[path] = found
        return found


# Where a build names the files it reads (git pathspecs: `*` also matches across `/`).
_BUILD_FILES = (
    "*CMakeLists.txt",
    "*.cmake",
    "*setup.py",
    "*setup.cfg",
    "*pyproject.toml",
    "*meson.build",
    "*meson.options",
    "*meson_options.txt",
    "*Makefile",
    "*.mk",
)
_C_SOURCES = ("*.c", "*.cc", "*.cpp", "*.cxx", "*.h", "*.hh", "*.hpp", "*.hxx", "*.cu", "*.inc")


def _ere_escape(text: str) -> str:
    """`text` as a literal in a POSIX extended regular expression (git grep -E)."""
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


def _beneath(path: str, parents: Collection[str]) -> bool:
    return any(path.startswith(parent + "/") for parent in parents)


def _norm(path: str) -> str:
    return path.strip().strip("/")


def _within(name: str, path: str) -> bool:
    """Whether repository path `name` is `path` or lies below it."""
    return name == path or name.startswith(path + "/")


def _shallow_cuts(repo: _Repo) -> set[str]:
    """The commits where the user's shallow clones of `repo` cut its history off (their
    `shallow` files, in the common dir of a linked worktree)."""
    listed: set[str] = set()
    for git_dir in repo.git_dirs:
        shallow = objects_dir(git_dir).parent / "shallow"
        with contextlib.suppress(OSError):
            listed.update(line.strip() for line in shallow.read_text().splitlines())
    listed.discard("")
    return listed


def _quote(name: str) -> str:
    """A submodule name as one safe path component (names may contain '/')."""
    safe = quote(name, safe="")
    return safe if safe not in {".", ".."} else safe.replace(".", "%2E")
