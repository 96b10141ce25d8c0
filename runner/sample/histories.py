"""Generated pypto / simpler / pypto-lib repositories with a known regression.

The test suite and `make demo` need histories shaped like the real ones (a runtime submodule added
part-way, bumps that move forward and backward, bumps that carry code, a submodule whose URL
changed, a nested submodule) with a regression at a chosen commit, so a bisect has one right
answer. They are real git repositories made with the git CLI: the tool under test drives real git,
so nothing here may be a stand-in.

The user's checkout is left the way an offline NPU host has it: every submodule was initialised
once, then the upstreams became unreachable, so exports must work from `.git/modules` alone.

Identities, dates and `.gitmodules` URLs are fixed (the URLs live under the reserved `.invalid`
domain and are redirected with `insteadOf` only while cloning), so the same spec yields the same
SHAs wherever it is generated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from runner.sample.packages import EXAMPLE_PATH, write_lib, write_pypto, write_simpler

REGRESSED = 1.001

SIMPLER_URL = "https://git.invalid/hw-native-sys/simpler.git"
LIBBACKTRACE_OLD_URL = "https://git.invalid/ianlancetaylor/libbacktrace.git"
LIBBACKTRACE_URL = "https://git.invalid/hw-native-sys/libbacktrace.git"
ISA_URL = "https://git.invalid/hw-native-sys/pto-isa.git"

RUNTIME_PATH = "runtime"
RUNTIME_NAME = "simpler"  # pypto's .gitmodules names the submodule "simpler", at path "runtime"
LIBBACKTRACE_PATH = "3rdparty/libbacktrace"
ISA_PATH = "third_party/isa"

_EPOCH = 1_704_096_000  # 2024-01-01T08:00:00Z
_DAY = 86_400


def pypto_date(index: int) -> str:
    """The commit date (UTC, ISO) of pypto index `index`, for date-ranged build pins."""
    return _iso_day(_EPOCH + (index + 1) * _DAY + 3600)


def simpler_date(index: int) -> str:
    return _iso_day(_EPOCH + index * _DAY)


def _iso_day(stamp: int) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).date().isoformat()


_CODE_SUBJECTS = (
    "feat(ir): add tile shape inference",
    "fix(codegen): keep loop bounds signed",
    "refactor(passes): split memory planning",
    "feat(frontend): accept bf16 inputs",
    "fix(runtime-api): release streams on error",
    "perf(codegen): fuse elementwise chains",
    "feat(ir): support strided loads",
    "fix(parser): handle trailing commas",
)
_BUMP_SUBJECTS = (
    "chore(runtime): bump simpler to {sha12}",
    "update Simpler to {sha7}",
    "bump runtime to {sha12}",
)
_CODE_BUMP_SUBJECTS = (
    "feat(codegen): adopt the new launch API",
    "fix(orchestration): follow runtime ring-buffer changes",
)
_SIMPLER_SUBJECTS = (
    "feat: add ring dependency pool",
    "fix: off-by-one in task window",
    "perf: vectorise accumulate",
    "feat: expose device memory stats",
    "fix: guard empty launches",
)


def git(repo: Path, *args: str, when: int = 0) -> str:
    """Run git with a fixed identity and date and no user/system config, so SHAs are stable.

    Public because tests that need an extra branch (a diverged bump, say) make it the same way.
    """
    stamp = f"@{_EPOCH + when} +0000"
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Sample Author",
        "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_COMMITTER_NAME": "Sample Committer",
        "GIT_COMMITTER_EMAIL": "committer@example.com",
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
    }
    completed = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}:\n{completed.stderr}")
    return completed.stdout.strip()


@dataclass(frozen=True)
class SampleSpec:
    """The shape of a sample history; indices are commit positions, 0 being the root commit."""

    pypto_commits: int = 12
    simpler_commits: int = 10
    runtime_added_at: int = 3
    runtime_initial: int = 2
    bumps: tuple[tuple[int, int], ...] = ((6, 6), (9, 8))
    code_with_bump: frozenset[int] = frozenset()
    pypto_regression_at: int | None = None
    simpler_regression_at: int | None = None
    simpler_fixed_at: int | None = None  # simpler index from which SCALE is 1.0 again
    broken_pypto: frozenset[int] = frozenset()
    broken_simpler: frozenset[int] = frozenset()
    # Simpler commits whose pyproject.toml is not TOML (a conflict marker left in): no build
    # can read what they need, so they cannot be built. Python only.
    unreadable_simpler: frozenset[int] = frozenset()
    libbacktrace_url_change_at: int = 5
    nested_submodule_at: int = 4
    # Native packages: C/C++ built by scikit-build-core and CMake. Their build configuration
    # moves to a newer backend era at these indices (None: never), as real pypto's did.
    native: bool = False
    pypto_new_era_at: int | None = None
    simpler_new_era_at: int | None = None
    # Seconds the example waits for the "card" (a sleep, leaving the CPUs free), as an NPU run does.
    example_seconds: float = 0.0
    # Native only: compile-time work (`packages.COMPILE_UNIT` each) in the translation unit every
    # commit changes, so an incremental build costs what the commit's recompiled C++ costs.
    compile_work: int = 0
    # (simpler index, pypto index): from that simpler commit on its kernel is `accumulate_v2`
    # only, and pypto imports that name from that pypto commit on (a bump with code, as real
    # pypto adapts to a new runtime API): a pair across the line fails at import. Python only.
    api_change: tuple[int, int] | None = None
    # Python only: simpler's regression is a value in a header (`include/abi.h`) that pypto's build
    # reads from the runtime submodule and bakes into its wheel; simpler's own code stays exact.
    regression_in_header: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    def pin(self, pypto_index: int) -> int | None:
        """The simpler index pinned at a pypto index (None before the runtime exists)."""
        if pypto_index < self.runtime_added_at:
            return None
        pinned = self.runtime_initial
        for at, target in self.bumps:
            if at <= pypto_index:
                pinned = target
        return pinned

    @property
    def bump_indices(self) -> frozenset[int]:
        return frozenset(at for at, _ in self.bumps)

    def pure_bump(self, pypto_index: int) -> bool:
        return pypto_index in self.bump_indices and pypto_index not in self.code_with_bump

    def pypto_regressed(self, pypto_index: int) -> bool:
        return self.pypto_regression_at is not None and pypto_index >= self.pypto_regression_at

    def simpler_regressed(self, simpler_index: int) -> bool:
        if self.simpler_regression_at is None or simpler_index < self.simpler_regression_at:
            return False
        return self.simpler_fixed_at is None or simpler_index < self.simpler_fixed_at

    def bad(self, pypto_index: int) -> bool:
        """Whether the example fails at this pypto commit (builds aside)."""
        pinned = self.pin(pypto_index)
        return self.pypto_regressed(pypto_index) or (
            pinned is not None and self.simpler_regressed(pinned)
        )


def spread_bumps(
    *, first_at: int, every: int, count: int, span: int, start: int = 0
) -> tuple[tuple[int, int], ...]:
    """Bumps at pypto indices first_at, first_at + every, ..., each moving the pointer `span`
    simpler commits forward from `start`: real pypto bumps about every 15 commits, spanning ~30.

    Pair it with `simpler_commits=start + count * span` and `runtime_initial=start`.
    """
    if every < 1 or span < 1 or count < 1:
        raise ValueError("every, span and count must be positive")
    return tuple((first_at + i * every, start + (i + 1) * span) for i in range(count))


def _validate(spec: SampleSpec) -> None:
    def pypto_index(value: int, what: str, low: int = 0) -> None:
        if not low <= value <= spec.pypto_commits:
            raise ValueError(f"{what}={value} is outside pypto indices {low}..{spec.pypto_commits}")

    def simpler_index(value: int, what: str, low: int = 0) -> None:
        if not low <= value <= spec.simpler_commits:
            raise ValueError(
                f"{what}={value} is outside simpler indices {low}..{spec.simpler_commits}"
            )

    if spec.example_seconds < 0:
        raise ValueError(f"example_seconds={spec.example_seconds} must not be negative")
    if spec.pypto_commits < 2 or spec.simpler_commits < 1:
        raise ValueError("a sample needs at least 2 pypto commits and 1 simpler commit")
    pypto_index(spec.runtime_added_at, "runtime_added_at", low=1)
    simpler_index(spec.runtime_initial, "runtime_initial")
    pypto_index(spec.libbacktrace_url_change_at, "libbacktrace_url_change_at", low=2)
    simpler_index(spec.nested_submodule_at, "nested_submodule_at", low=1)
    previous_at, previous_pin = spec.runtime_added_at, spec.runtime_initial
    for at, target in spec.bumps:
        pypto_index(at, "bump pypto index")
        simpler_index(target, "bump simpler index")
        if at <= previous_at:
            raise ValueError(
                f"bump at pypto index {at} must come after runtime_added_at and earlier bumps "
                "(bumps are sorted by pypto index)"
            )
        if target == previous_pin:
            raise ValueError(f"bump at pypto index {at} does not move the pointer")
        previous_at, previous_pin = at, target
    stray = spec.code_with_bump - spec.bump_indices
    if stray:
        raise ValueError(f"code_with_bump names pypto indices without a bump: {sorted(stray)}")
    if spec.libbacktrace_url_change_at in spec.bump_indices | {spec.runtime_added_at}:
        raise ValueError("libbacktrace_url_change_at must not coincide with a runtime change")
    if spec.pypto_regression_at is not None:
        pypto_index(spec.pypto_regression_at, "pypto_regression_at")
        if spec.pure_bump(spec.pypto_regression_at):
            raise ValueError(
                f"pypto_regression_at={spec.pypto_regression_at} is a pointer-only bump; "
                "add it to code_with_bump to regress pypto code there"
            )
    if spec.simpler_regression_at is not None:
        simpler_index(spec.simpler_regression_at, "simpler_regression_at")
    if spec.simpler_fixed_at is not None:
        simpler_index(spec.simpler_fixed_at, "simpler_fixed_at", low=1)
        if (
            spec.simpler_regression_at is None
            or spec.simpler_fixed_at <= spec.simpler_regression_at
        ):
            raise ValueError("simpler_fixed_at must come after simpler_regression_at")
    if spec.pypto_new_era_at is not None:
        pypto_index(spec.pypto_new_era_at, "pypto_new_era_at")
        if spec.pure_bump(spec.pypto_new_era_at):
            raise ValueError("pypto_new_era_at must not be a pointer-only bump")
    if spec.simpler_new_era_at is not None:
        simpler_index(spec.simpler_new_era_at, "simpler_new_era_at")
    if spec.api_change is not None:
        simpler_at, pypto_at = spec.api_change
        simpler_index(simpler_at, "api_change simpler index", low=1)
        pypto_index(pypto_at, "api_change pypto index", low=spec.runtime_added_at)
        if spec.native:
            raise ValueError("api_change is for the pure-Python sample")
        if spec.pure_bump(pypto_at):
            raise ValueError(f"api_change pypto index {pypto_at} must change pypto's code")
    for index in spec.broken_pypto:
        pypto_index(index, "broken_pypto")
    for index in spec.broken_simpler:
        simpler_index(index, "broken_simpler")
    for index in spec.unreadable_simpler:
        simpler_index(index, "unreadable_simpler")
    if spec.unreadable_simpler and spec.native:
        raise ValueError("unreadable_simpler is for the pure-Python sample")
    for at in spec.bump_indices - spec.code_with_bump:
        if (at in spec.broken_pypto) != (at - 1 in spec.broken_pypto):
            raise ValueError(
                f"pointer-only bump at pypto index {at} cannot change whether pypto builds; "
                "add it to code_with_bump"
            )


@dataclass(frozen=True)
class Culprit:
    """Where a correct bisect of the whole sample range must end."""

    pypto_index: int
    pypto_sha: str
    simpler_index: int | None = None  # set when the culprit is a bump and simpler regressed
    simpler_sha: str | None = None


@dataclass
class Sample:
    spec: SampleSpec
    root: Path
    pypto: Path
    """The user's checkout, submodules initialised, every submodule remote unreachable."""
    lib: Path
    script: str
    pypto_shas: list[str]
    simpler_shas: list[str]
    libbacktrace_shas: list[str] = field(default_factory=list)
    isa_shas: list[str] = field(default_factory=list)
    mirrors: dict[str, Path] = field(default_factory=dict)
    """The relocated upstreams ("simpler", "libbacktrace", "isa", "pypto"), like a tool mirror."""

    @property
    def runtime_gitdir(self) -> Path:
        """Where the checkout keeps simpler's objects (named by submodule name, not path)."""
        return self.pypto / ".git" / "modules" / RUNTIME_NAME

    def gitlink(self, pypto_index: int) -> str | None:
        pinned = self.spec.pin(pypto_index)
        return None if pinned is None else self.simpler_shas[pinned]

    def pypto_index(self, sha: str) -> int:
        return _index_of(self.pypto_shas, sha, "pypto")

    def simpler_index(self, sha: str) -> int:
        return _index_of(self.simpler_shas, sha, "simpler")

    def expected_first_bad(self) -> Culprit | None:
        """The first bad pypto commit and, when a simpler bump caused it, the simpler commit.

        None when the whole history is good. Builds are ignored: a broken culprit is the test's
        business.
        """
        spec = self.spec
        first = next((i for i in range(spec.pypto_commits + 1) if spec.bad(i)), None)
        if first is None:
            return None
        culprit = Culprit(pypto_index=first, pypto_sha=self.pypto_shas[first])
        old, new = spec.pin(first - 1) if first else None, spec.pin(first)
        if spec.pypto_regressed(first) or old is None or new is None or old == new:
            return culprit
        step = 1 if new > old else -1
        for index in range(old + step, new + step, step):
            if spec.simpler_regressed(index):
                return Culprit(first, self.pypto_shas[first], index, self.simpler_shas[index])
        return culprit


def _index_of(shas: list[str], sha: str, what: str) -> int:
    matches = [i for i, candidate in enumerate(shas) if candidate.startswith(sha)]
    if len(matches) != 1:
        raise KeyError(f"{sha} is not one {what} commit of this sample")
    return matches[0]


def _gitmodules(entries: list[tuple[str, str, str]]) -> str:
    return "".join(
        f'[submodule "{name}"]\n\tpath = {path}\n\turl = {url}\n' for name, path, url in entries
    )


class _Upstream:
    """Writes a linear history into a bare repository with one `git fast-import`.

    Package writers fill a scratch work dir; every commit snapshots it whole (plus the gitlinks)
    the way `git add -A` would. One process per repository instead of three per commit keeps a
    sample well under a second even on a busy machine.
    """

    def __init__(self, repo: Path, work: Path) -> None:
        self.repo, self.work = repo, work
        work.mkdir(parents=True)
        self.gitlinks: dict[str, str] = {}
        self._stream = bytearray()

    def pin(self, path: str, sha: str) -> None:
        self.gitlinks[path] = sha

    def commit(self, message: str, when: int) -> None:
        stamp = f"{_EPOCH + when} +0000"
        text = message.encode() + b"\n"
        self._stream += (
            f"commit refs/heads/main\n"
            f"author Sample Author <author@example.com> {stamp}\n"
            f"committer Sample Committer <committer@example.com> {stamp}\n"
            f"data {len(text)}\n"
        ).encode()
        self._stream += text + b"deleteall\n"
        for file in sorted(p for p in self.work.rglob("*") if p.is_file()):
            content = file.read_bytes()
            name = file.relative_to(self.work).as_posix()
            self._stream += f"M 100644 inline {name}\ndata {len(content)}\n".encode()
            self._stream += content + b"\n"
        for path, sha in sorted(self.gitlinks.items()):
            self._stream += f"M 160000 {sha} {path}\n".encode()
        self._stream += b"\n"

    def finish(self) -> list[str]:
        """Write the history; return the commit SHAs oldest first."""
        git(self.repo.parent, "init", "-q", "--bare", str(self.repo))
        subprocess.run(
            ["git", "fast-import", "--quiet", "--done"],
            cwd=self.repo,
            input=bytes(self._stream) + b"done\n",
            env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"},
            capture_output=True,
            check=True,
        )
        shutil.rmtree(self.work)
        return git(self.repo, "rev-list", "--reverse", "main").split()


def _tiny_repo(upstream: _Upstream, name: str, count: int, when: int) -> list[str]:
    for index in range(count):
        (upstream.work / "VERSION").write_text(f"{name} {index}\n")
        (upstream.work / f"{name}.h").write_text(f"#define {name.upper()}_LEVEL {index}\n")
        upstream.commit(f"{name}: release {index}", when + index * 3600)
    return upstream.finish()


def _make_simpler(upstream: _Upstream, spec: SampleSpec, isa_sha: str) -> list[str]:
    for index in range(spec.simpler_commits + 1):
        write_simpler(
            upstream.work,
            revision=index,
            scale=REGRESSED if spec.simpler_regressed(index) else 1.0,
            broken=index in spec.broken_simpler,
            native=spec.native,
            new_era=spec.simpler_new_era_at is not None and index >= spec.simpler_new_era_at,
            compile_work=spec.compile_work,
            api_v2=spec.api_change is not None and index >= spec.api_change[0],
            unreadable=index in spec.unreadable_simpler,
            in_header=spec.regression_in_header,
        )
        if index == spec.nested_submodule_at:
            gitmodules = _gitmodules([(ISA_PATH, ISA_PATH, ISA_URL)])
            (upstream.work / ".gitmodules").write_text(gitmodules)
            upstream.pin(ISA_PATH, isa_sha)
            subject = "build: vendor pto-isa as third_party/isa"
        elif index == 0:
            subject = "init: simpler runtime"
        else:
            subject = _SIMPLER_SUBJECTS[index % len(_SIMPLER_SUBJECTS)]
        upstream.commit(f"{subject} (r{index})", index * _DAY)
    return upstream.finish()


def _make_pypto(
    upstream: _Upstream, spec: SampleSpec, simpler: list[str], libbacktrace: list[str]
) -> list[str]:
    bumps = dict(spec.bumps)
    bump_count = code_count = 0
    for index in range(spec.pypto_commits + 1):
        when = (index + 1) * _DAY + 3600
        if not spec.pure_bump(index):
            write_pypto(
                upstream.work,
                revision=index,
                factor=REGRESSED if spec.pypto_regressed(index) else 1.0,
                uses_simpler=index >= spec.runtime_added_at,
                broken=index in spec.broken_pypto,
                native=spec.native,
                new_era=spec.pypto_new_era_at is not None and index >= spec.pypto_new_era_at,
                compile_work=spec.compile_work,
                api_v2=spec.api_change is not None and index >= spec.api_change[1],
                bakes_runtime=spec.regression_in_header and index >= spec.runtime_added_at,
            )
        if index in (1, spec.runtime_added_at, spec.libbacktrace_url_change_at):
            moved = index >= spec.libbacktrace_url_change_at
            url = LIBBACKTRACE_URL if moved else LIBBACKTRACE_OLD_URL
            entries = [(LIBBACKTRACE_PATH, LIBBACKTRACE_PATH, url)]
            if index >= spec.runtime_added_at:
                entries.append((RUNTIME_NAME, RUNTIME_PATH, SIMPLER_URL))
            (upstream.work / ".gitmodules").write_text(_gitmodules(entries))
        if index == 1:
            upstream.pin(LIBBACKTRACE_PATH, libbacktrace[0])
        if index == spec.libbacktrace_url_change_at:
            upstream.pin(LIBBACKTRACE_PATH, libbacktrace[-1])
        pinned = spec.pin(index)
        if pinned is not None:
            upstream.pin(RUNTIME_PATH, simpler[pinned])
        short = simpler[pinned][:12] if pinned is not None else ""
        if index == 0:
            subject = "init: pypto compiler skeleton"
        elif index == spec.runtime_added_at:
            subject = "feat(runtime): add simpler as the runtime submodule"
        elif index in bumps and index in spec.code_with_bump:
            subject = _CODE_BUMP_SUBJECTS[bump_count % len(_CODE_BUMP_SUBJECTS)]
            bump_count += 1
        elif index in bumps:
            template = _BUMP_SUBJECTS[bump_count % len(_BUMP_SUBJECTS)]
            subject = template.format(sha12=short, sha7=short[:7])
            bump_count += 1
        elif index == spec.libbacktrace_url_change_at:
            subject = "build: move libbacktrace to the hw-native-sys mirror"
        elif index == 1:
            subject = "build: add libbacktrace for stack traces"
        else:
            subject = _CODE_SUBJECTS[code_count % len(_CODE_SUBJECTS)]
            code_count += 1
        upstream.commit(subject, when)
    return upstream.finish()


def _cut_off_upstreams(checkout: Path, gone: Path) -> None:
    """Point every submodule remote of a checkout at a path that does not exist."""
    configs = [checkout / ".git" / "config"]
    configs += sorted(
        head.parent / "config" for head in (checkout / ".git" / "modules").rglob("HEAD")
    )
    for config in configs:
        if not config.is_file():
            continue
        listed = git(
            config.parent,
            "config",
            "--file",
            str(config),
            "--get-regexp",
            r"^(submodule\..*|remote\..*)\.url$",
        )
        for line in listed.splitlines():
            key, _, _url = line.partition(" ")
            if config.parent.name == ".git" and key.startswith("remote."):
                continue  # the user's own pypto remote stays
            where = config.parent.relative_to(checkout).as_posix().replace("/", "_")
            target = gone / where / key.removesuffix(".url").replace("/", "_")
            git(config.parent, "config", "--file", str(config), key, str(target))


def make_sample(root: Path, spec: SampleSpec | None = None) -> Sample:
    """Generate upstreams, clone the user's checkout offline-style, and write pypto-lib."""
    spec = spec or SampleSpec()
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    upstream = root / "upstream"
    upstream.mkdir()

    def start(name: str) -> _Upstream:
        return _Upstream(upstream / name, root / "scratch" / name)

    isa = _tiny_repo(start("isa"), "isa", 2, when=-10 * _DAY)
    libbacktrace = _tiny_repo(start("libbacktrace"), "backtrace", 3, when=-20 * _DAY)
    simpler = _make_simpler(start("simpler"), spec, isa[-1])
    pypto = _make_pypto(start("pypto"), spec, simpler, libbacktrace)
    (root / "scratch").rmdir()

    checkout = root / "pypto"
    redirects = {
        SIMPLER_URL: upstream / "simpler",
        LIBBACKTRACE_URL: upstream / "libbacktrace",
        ISA_URL: upstream / "isa",
    }
    options = ["-c", "protocol.file.allow=always"]
    for url, path in redirects.items():
        options += ["-c", f"url.{path}.insteadOf={url}"]
    git(root, *options, "clone", "-q", "--recurse-submodules", str(upstream / "pypto"), "pypto")
    _cut_off_upstreams(checkout, root / "gone")

    mirrors = root / "mirrors"
    mirrors.mkdir()
    for name in ("simpler", "libbacktrace", "isa", "pypto"):
        shutil.move(str(upstream / name), str(mirrors / name))
    upstream.rmdir()

    lib = root / "pypto-lib"
    git(root, "init", "-q", str(lib))
    write_lib(lib, example_seconds=spec.example_seconds)
    git(lib, "add", "-A")
    git(lib, "commit", "-q", "-m", "feat(models): add the sample decode example")

    return Sample(
        spec=spec,
        root=root,
        pypto=checkout,
        lib=lib,
        script=EXAMPLE_PATH,
        pypto_shas=pypto,
        simpler_shas=simpler,
        libbacktrace_shas=libbacktrace,
        isa_shas=isa,
        mirrors={name: mirrors / name for name in ("simpler", "libbacktrace", "isa", "pypto")},
    )
