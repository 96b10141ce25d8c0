"""Which builder each commit needs: the commit's own requirements, read from git, provisioned.

Sits between the git side (the exporter reads pyproject.toml and commit dates from its mirrors)
and the Docker side (the provisioner); `run` asks it per attempt, and ahead of the first step
(and `builder prepare`) for the commits where the requirements can change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runner.builders import Builder, Provisioner, Resolution
from runner.sources import SourceExporter


@dataclass(frozen=True)
class Planned:
    package: str
    commit: str
    resolution: Resolution
    builder: Builder | None  # None when only resolved and downloaded


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
        if package == "simpler":
            pyproject, when = self.exporter.read(
                commit, "pyproject.toml", submodule=self.path, at=at
            )
        else:
            pyproject, when = self.exporter.read(commit, "pyproject.toml")
        return self.provisioner.resolve(package, commit, pyproject, when)

    def builder(self, package: str, commit: str, at: str | None = None) -> Builder:
        resolution = self.resolution(package, commit, at)
        self.phase(f"builder for {package} {commit[:12]}")
        return self.provisioner.builder(resolution, f"{package} {commit[:12]}")

    def plan(
        self, chain: Sequence[str], gitlinks: Mapping[str, str | None], *, build: bool = False
    ) -> list[Planned]:
        """Resolve (and download, or build) the tools of a first-parent range ahead of time.

        Covered: the endpoints and every commit that edits pyproject.toml, and the simpler
        commits pinned anywhere in `gitlinks`. A requirement nothing satisfies then stops the
        run with one line naming the commit before the first bisect step.
        """
        if not chain:
            return []
        self.phase("build tools")
        changed = set(self.exporter.changed(chain[0], chain[-1], "pyproject.toml"))
        targets = [("pypto", c, None) for c in chain if c in changed or c in (chain[0], chain[-1])]
        pinned: dict[str, str] = {}
        for commit in chain:
            sha = gitlinks.get(commit)
            if sha is not None:
                pinned.setdefault(sha, commit)
        targets += [("simpler", sha, at) for sha, at in pinned.items()]
        planned = []
        for package, commit, at in targets:
            resolution = self.resolution(package, commit, at)
            where = f"{package} {commit[:12]}"
            if build:
                made = self.provisioner.builder(resolution, where)
            else:
                self.provisioner.download(resolution, where)
                made = None
            planned.append(Planned(package, commit, resolution, made))
        return planned
