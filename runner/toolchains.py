"""Which builder each commit needs: the commit's own requirements, read from git, provisioned.

Sits between the git side (the exporter reads pyproject.toml and commit dates from its mirrors)
and the Docker side (the provisioner); `run` asks it per attempt, and ahead of the first step
(and `builder prepare`) for the commits where the requirements can change.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from runner.builders import Builder, ImageCannotBuild, Provisioner, Resolution
from runner.errors import BadInput, BisectError, UnbuildableCommit
from runner.history import pointer_states
from runner.sources import SourceExporter


@dataclass(frozen=True)
class Planned:
    package: str
    commit: str
    resolution: Resolution
    builder: Builder | None  # None when only resolved and downloaded

    @property
    def where(self) -> str:
        return f"{self.package} {self.commit[:12]}"


class Toolchains:
    def __init__(
        self,
        exporter: SourceExporter,
        provisioner: Provisioner,
        *,
        submodule_path: str = "runtime",
        phase: Callable[[str], None] | None = None,
    ) -> None:
        self.exporter = exporter
        self.provisioner = provisioner
        self.path = submodule_path
        self.phase = phase or (lambda _name: None)

    def resolution(self, package: str, commit: str, at: str | None = None) -> Resolution:
        """`at`: the pypto commit whose runtime submodule holds a simpler `commit`."""
        where = {"submodule": self.path, "at": at} if package == "simpler" else {}
        files, when = self.exporter.read_files(
            commit, ("pyproject.toml", "CMakeLists.txt", "setup.py"), **where
        )
        pyproject = files.pop("pyproject.toml")
        return self.provisioner.resolve(package, commit, pyproject, when, files)

    def _require_project(self, sha: str | None, at: str) -> None:
        """The known-bad commit's runtime must be a Python project: a --submodule-path naming
        another submodule (a C library, say) would build it as simpler and fail every test."""
        if sha is None:
            return
        for name in ("pyproject.toml", "setup.py"):
            if self.exporter.read(sha, name, submodule=self.path, at=at)[0] is not None:
                return
        raise BadInput(
            f"the submodule at {self.path} ({sha[:12]} in the known-bad commit) has no "
            "pyproject.toml or setup.py, so it is not simpler's Python project: give "
            "--submodule-path the path of the runtime submodule"
        )

    def builder(
        self, package: str, commit: str, at: str | None = None, *, show: bool = True
    ) -> Builder:
        """`show`: name it as the phase (not for builds ahead, which nothing waits for)."""
        resolution = self.resolution(package, commit, at)
        if show:
            self.phase(f"builder for {package} {commit[:12]}")
        return self.provisioner.builder(resolution, f"{package} {commit[:12]}")

    def plan(
        self,
        chain: Sequence[str],
        gitlinks: Mapping[str, str | None],
        *,
        build: bool = False,
        every: bool = False,
        skip: Collection[str] = (),
        warn: Callable[[str], None] | None = None,
    ) -> list[Planned]:
        """Resolve (and download, or build) the tools of a first-parent range ahead of time.

        Covered: the endpoints and every commit that edits pyproject.toml, and the simpler
        commits pinned anywhere in `gitlinks`. At an end, a build configuration nothing can
        build (not TOML, a requirement no release on the index satisfies) stops the run with one
        line naming the commit before the first bisect step; between the ends such a commit's
        tests are skips, and `warn` says so now. Tools a wheelhouse or an index that did not
        answer lacks stop the run wherever they are asked for. `every` (`builder
        prepare`): every pypto commit of the range and every simpler commit inside its bumps,
        since tools picked by date change with the commit's date, not only with its pyproject.
        Commits in `skip` (the user's `--skip`) are never built, so their tools are not needed.
        """
        if not chain:
            return []
        self.phase("build tools")
        changed = set(self.exporter.changed(chain[0], chain[-1], "pyproject.toml"))
        targets = [
            ("pypto", c, None) for c in chain if every or c in changed or c in (chain[0], chain[-1])
        ]
        pinned: dict[str, str] = {}
        for commit in chain:
            sha = gitlinks.get(commit)
            if sha is not None:
                pinned.setdefault(sha, commit)
        if every:
            for sha, at in self._inside_bumps(chain, gitlinks).items():
                pinned.setdefault(sha, at)
        targets += [("simpler", sha, at) for sha, at in pinned.items()]
        self._require_project(gitlinks.get(chain[-1]), chain[-1])
        ends = {chain[0], chain[-1], gitlinks.get(chain[0]), gitlinks.get(chain[-1])}
        resolved: list[Planned] = []
        for package, commit, at in targets:
            if commit in skip:
                continue
            try:
                resolution = self.resolution(package, commit, at)
            except UnbuildableCommit as exc:
                if commit in ends:
                    raise  # nothing to bisect from: say so before the first step
                if warn is not None:  # a commit in between: its test is a skip
                    warn(
                        f"{exc.package} {commit[:12]} cannot be built ({exc.detail}): its tests "
                        "are skips"
                    )
                continue
            except ImageCannotBuild:
                raise  # no commit of the range builds: skipping one helps nothing
            except BadInput as exc:  # e.g. a requirement no release satisfies
                raise skippable(exc, commit, ends) from None
            resolved.append(Planned(package, commit, resolution, None))
        if not build:
            self._download(resolved, ends)
            return resolved
        built = []
        for planned in resolved:
            try:
                made = self.provisioner.builder(planned.resolution, planned.where)
            except BadInput as exc:
                raise skippable(exc, planned.commit, ends) from None
            built.append(replace(planned, builder=made))
        return built

    def _download(self, resolved: Sequence[Planned], ends: Collection[str | None]) -> None:
        """Each distinct set of tools once, the sets side by side: a `pip download` is mostly
        pip's own start-up and the index's answers, and pypto's and simpler's tools differ.
        A failure is raised for the first commit that needs the set, as one by one would."""
        first: dict[tuple[str, ...], Planned] = {}
        for planned in resolved:
            first.setdefault(planned.resolution.pins, planned)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="tools") as pool:
            downloads = [
                (
                    planned.commit,
                    pool.submit(self.provisioner.download, planned.resolution, planned.where),
                )
                for planned in first.values()
            ]
            for commit, download in downloads:
                try:
                    download.result()
                except BadInput as exc:
                    raise skippable(exc, commit, ends) from None

    def _inside_bumps(
        self, chain: Sequence[str], gitlinks: Mapping[str, str | None]
    ) -> dict[str, str]:
        """The simpler commits a second level may test, each with its bump's pypto commit; a
        bump whose history is missing or unrelated has none (the run says why if it gets there)."""
        inside: dict[str, str] = {}
        for before, commit in itertools.pairwise(chain):
            old, new = gitlinks.get(before), gitlinks.get(commit)
            if old is None or new is None or old == new:
                continue
            try:
                _direction, states = pointer_states(
                    self.exporter.submodule_git_dir(self.path), old, new
                )
            except BisectError:
                continue
            for sha in states:
                inside.setdefault(sha, commit)
        return inside


def skippable(exc: BadInput, commit: str, ends: Collection[str | None]) -> BadInput:
    """A commit between the ends whose tools nothing supplies may be skipped instead: `exc`
    with the --skip that does it (as it is for an end, which cannot be skipped)."""
    if commit in ends or isinstance(exc, UnbuildableCommit):
        return exc
    return BadInput(
        f"{exc}; or, if it cannot be built, --skip {commit[:12]} takes it as untestable"
    )
