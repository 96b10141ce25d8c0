"""Resolve and validate everything a bisect needs before anything is built.

Each problem surfaces here as one clear `BisectError` (exit 2 for bad input, 4 for the engine), so a
typo in a revision costs a second, not a wheel build.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import docker
import docker.errors

from runner import __version__
from runner.builders import PackageSources, Provisioner
from runner.config import Settings, memory_bytes
from runner.devices import Passthrough, is_simulator, parse_device_map, passthrough
from runner.errors import BadInput, BisectError, InfrastructureError
from runner.execute import connect
from runner.executor import Slot
from runner.history import History
from runner.inputs import SNAPSHOTS, tree_digest
from runner.ledger import SessionInputs
from runner.sources import SourceExporter
from runner.toolchains import Planned, Toolchains
from runner.verdict import VerdictPatterns


@dataclass
class Prepared:
    settings: Settings
    history: History
    lib: Path
    script: str
    good: str
    bad: str
    commits: list[str]
    passthrough: Passthrough
    patterns: VerdictPatterns
    client: docker.DockerClient
    base_image_id: str
    workdir: Path
    lib_digest: str
    lib_exclude: tuple[Path, ...]  # directories inside pypto-lib its digest leaves out
    content: dict[str, str]  # "pto_isa_root"/"ptoas_root" -> tree digest, when given
    cache_root: Path
    exporter: SourceExporter
    inputs: SessionInputs
    slots: list[Slot] = field(default_factory=list)
    skip: frozenset[str] = frozenset()  # --skip: full SHAs of pypto and simpler commits
    tool_version: str = __version__
    warnings: list[str] = field(default_factory=list)  # said once, at the start of `run`


def _directory(value: Path | None, flag: str, what: str, given: str | None = None) -> Path:
    """`given`: the argument as the user wrote it, when not `flag value`."""
    if value is None:
        raise BadInput(f"{flag} is required: the path of {what}")
    path = value.expanduser().resolve()
    if not path.is_dir():
        raise BadInput(f"{given or f'{flag} {value}'}: no such directory")
    return path


def _unused_settings(settings: Settings) -> list[str]:
    """Settings the chosen search ignores: say so rather than let the user believe them."""
    given = settings.model_fields_set
    unused = []
    if settings.repeat is None and "policy" in given:
        unused.append(
            f"{settings.given_as('policy')} applies to fixed repeats only (--repeat N); "
            "the confidence search runs"
        )
    if settings.repeat is not None and "confidence" in given:
        unused.append(
            f"{settings.given_as('confidence')} is not used with --repeat "
            f"{settings.repeat}: each commit runs that many times"
        )
    if settings.repeat is not None and settings.repeat % 2 == 0 and settings.policy == "majority":
        unused.append(
            f"--repeat {settings.repeat} with the majority policy: a tie (half the runs fail) "
            "counts as bad; an odd number of repeats never ties"
        )
    if settings.executor == "ray" and "device" in given:
        unused.append(
            f"{settings.given_as('device')} is not used with --executor ray: Ray picks the cards "
            "(a simulator run is lane 0 of its own container)"
        )
    if settings.executor != "ray" and "ray_address" in given:
        unused.append(
            f"{settings.given_as('ray_address')} is not used: the run is local without "
            "--executor ray"
        )
    return unused


def _fits_the_engine(client: docker.DockerClient, settings: Settings) -> None:
    """The engine refuses a container with more CPUs than its host has, and one limited to more
    memory than it has can never be held to its limit: say so before the first build, not as
    three infrastructure failures."""
    runtime = settings.device_mode == "ascend-runtime" and not is_simulator(settings.platform)
    if settings.cpus is None and settings.memory is None and not runtime:
        return
    try:
        info = client.info()
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"the Docker Engine did not answer `docker info`: {exc}") from exc
    if runtime and "ascend" not in (info.get("Runtimes") or {}):
        known = ", ".join(sorted(info.get("Runtimes") or {})) or "none"
        raise BadInput(
            f"{settings.given_as('device_mode')} ascend-runtime: the Docker Engine has no "
            f"`ascend` runtime (it has {known}); install Ascend Docker Runtime and register it "
            "in /etc/docker/daemon.json, or use --device-mode explicit"
        )
    available = int(info.get("NCPU") or 0)
    if settings.cpus is not None and available and settings.cpus > available:
        raise BadInput(
            f"{settings.given_as('cpus')} {settings.cpus:g} is more than the {available} CPUs "
            "of the Docker Engine's host"
        )
    total = int(info.get("MemTotal") or 0)
    if settings.memory is not None and total and memory_bytes(settings.memory) > total:
        raise BadInput(
            f"{settings.given_as('memory')} {settings.memory} is more than the "
            f"{total / 2**30:.1f} GiB of memory of the Docker Engine's host"
        )


def _create(path: Path, value: Path, flag: str) -> None:
    """Make a directory `writable_directory` allowed: a path writable on paper may still refuse
    one (under /proc, a read-only mount), which is the path's fault, not the machine's."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise InfrastructureError(f"{flag} {value}: cannot create it ({exc.strerror})") from exc
        raise BadInput(f"{flag} {value}: cannot create it ({exc.strerror or exc})") from None


def writable_directory(value: Path, flag: str) -> Path:
    """A directory the tool may create or write into; bad input (not a failure of the machine)
    when the path names a file, or lies under a file or a directory this user cannot write."""
    path = value.expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise BadInput(f"{flag} {value} is a file, not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise BadInput(f"{flag} {value}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {value}: {existing} is not writable by this user")
    return path


def _script(lib: Path, script: str | None, given_as: str = "--script") -> str:
    if not script:
        raise BadInput("--script is required: the example to run, relative to --lib")
    relative = PurePosixPath(posixpath.normpath(script))  # ex/../ex/run.py is ex/run.py
    if relative.is_absolute() or ".." in relative.parts:
        raise BadInput(f"{given_as} {script}: give a path inside --lib, relative to it")
    if not (lib / relative).is_file():
        raise BadInput(f"{given_as} {script}: no such file in {lib}")
    # The runs see a copy of --lib alone, at another path: a link out of it, or one by an
    # absolute path, points at nothing there (every test would be a skip).
    path = lib / relative
    target = path.resolve()
    if not target.is_relative_to(lib.resolve()):
        raise BadInput(
            f"{given_as} {script}: a link to {target}, outside --lib, which the runs do not "
            "see; copy the example into --lib"
        )
    if path.is_symlink() and os.path.isabs(os.readlink(path)):
        raise BadInput(
            f"{given_as} {script}: a link by the absolute path {os.readlink(path)}, which the "
            "runs do not see (--lib is mounted elsewhere); make the link relative"
        )
    return relative.as_posix()


# Docker's image reference (distribution/reference): [host[:port]/]path[:tag][@digest], or an
# image id. A name the engine would reject is the user's typo, not the engine's fault.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)


def base_image_id(client: docker.DockerClient, name: str, given_as: str = "--base-image") -> str:
    if not name.strip():
        raise BadInput(f"{given_as} is empty: name the CANN-based image to build and run in")
    if not IMAGE_REFERENCE.fullmatch(name):
        raise BadInput(
            f"{given_as} {name!r} is not an image name Docker accepts "
            "(repository[:tag][@digest], lowercase repository, no spaces)"
        )
    try:
        return client.images.get(name).id
    except docker.errors.ImageNotFound:
        raise BadInput(
            f"base image {name} is not in the Docker Engine; pull or load it first "
            "(nothing is pulled automatically, so every verdict uses a known image)"
        ) from None
    except docker.errors.APIError as exc:
        if exc.status_code == 400:  # the engine refuses the name itself
            raise BadInput(
                f"{given_as} {name!r} is not an image name Docker accepts: {exc.explanation or exc}"
            ) from None
        raise InfrastructureError(f"the Docker Engine failed to inspect {name}: {exc}") from exc


def session_digest(settings: Settings, lib_digest: str, content: dict[str, str]) -> str:
    """Settings that can change a verdict, plus the pypto-lib tree (the example, its helpers and
    goldens) and pto-isa/ptoas by content: editing any of them between two runs must not mix old
    verdicts with new ones in one ledger."""
    parts = [settings.run_digest(), lib_digest, *(f"{k}={v}" for k, v in sorted(content.items()))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _unrelated_clones(
    history: History, ends: Sequence[str], extra: Mapping[str, Sequence[Path]]
) -> list[str]:
    """Clones given for a top-level submodule of which none holds either endpoint's pin: likely
    the wrong repository (the checkout of pypto-lib, say), which would only surface later as
    'source unavailable'. (A fork given beside upstream may hold neither.)"""
    warnings = []
    for path, clones in extra.items():
        named = " and ".join(str(clone) for clone in clones)
        one = len(clones) == 1
        pins = {pin for pin in (history.gitlink(end, path) for end in ends) if pin}
        parts = path.split("/")
        outer = ("/".join(parts[:n]) for n in range(1, len(parts)))
        if not pins and any(history.gitlink(end, p) for p in outer for end in ends):
            continue  # a submodule of a submodule (runtime/third_party/x): pypto pins none
        if not pins:
            warnings.append(
                f"{named} {'is' if one else 'are'} given for the submodule at {path}, but "
                f"neither endpoint has one there; {'it is' if one else 'they are'} used only if "
                "a commit in between has one"
            )
            continue
        if not any(History(clone).has_commit(pin) for pin in pins for clone in clones):
            listed = ", ".join(sorted(pin[:12] for pin in pins))
            warnings.append(
                f"{named} {'holds' if one else 'hold'} neither endpoint's {path} "
                f"commit ({listed}): is it a clone of the {path} submodule's repository?"
            )
    return warnings


def extra_repos(settings: Settings) -> dict[str, tuple[Path, ...]]:
    """--simpler and --submodule-source: other clones whose objects complement a submodule's."""
    repos: dict[str, tuple[Path, ...]] = {}
    for path, clones in settings.submodule_repos().items():
        found = []
        for clone in clones:
            flag, given = "--simpler", None
            if clone != settings.simpler:
                flag, given = "--submodule-source", f"--submodule-source {path}={clone}"
            found.append(_directory(clone, flag, f"a clone of the {path} submodule", given))
            History(found[-1])  # refuses a directory that is not a git repository
        repos[path] = tuple(found)
    return repos


def make_provisioner(
    settings: Settings,
    client: docker.DockerClient,
    base_image_id: str,
    cache_root: Path,
    *,
    echo: Callable[[str], None] | None = None,
) -> Provisioner:
    """Builder images for this base image, with tools from --wheelhouse or pip's indexes."""
    wheelhouse = settings.wheelhouse.expanduser().resolve() if settings.wheelhouse else None
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise BadInput(
            f"{settings.given_as('wheelhouse')} {settings.wheelhouse}: no such directory"
        )
    return Provisioner(
        client,
        base_image_id=base_image_id,
        cache_root=cache_root,
        sources=PackageSources(wheelhouse=wheelhouse),
        pins=settings.build_pins,
        by_date=settings.resolve_by_date,
        python=settings.python,
        echo=echo,
        base_image=settings.base_image,
    )


def prepare_builders(
    settings: Settings, *, echo: Callable[[str], None] | None = None
) -> list[Planned]:
    """`builder prepare`: every builder image the range may need, built before a run."""
    pypto_path = _directory(settings.pypto, settings.given_as("pypto"), "the pypto checkout")
    history = History(pypto_path)
    if not settings.known_good:
        raise BadInput("no known-good commit: pass --good REV (the range starts there)")
    good = history.resolve(settings.known_good)
    chain = [good, *history.first_parent_range(settings.known_good, settings.bad or "HEAD")]
    _check_submodule_path(history, good, chain[1:], settings)  # as `run` does
    client = connect()
    image_id = base_image_id(client, settings.base_image, settings.given_as("base_image"))
    cache_root = settings.cache_root().resolve()
    toolchains = Toolchains(
        SourceExporter(
            pypto_path, cache_root, extra_repos(settings), runtime=settings.submodule_path
        ),
        make_provisioner(settings, client, image_id, cache_root, echo=echo),
        submodule_path=settings.submodule_path,
    )
    gitlinks = history.gitlinks(chain, settings.submodule_path)
    return toolchains.plan(chain, gitlinks, build=True, every=True, warn=echo)


def _check_submodule_path(
    history: History, good: str, commits: Sequence[str], settings: Settings
) -> None:
    """Stop before any build when the runtime is not where every test would look for it: a
    path set on purpose that neither end has, or a runtime that moves to another path within
    the range (the tests on one side would all run without it and be skipped)."""
    path, bad = settings.submodule_path, commits[-1]
    at = {end: history.submodules(end) for end in (good, bad)}
    there = [end for end in (good, bad) if path in at[end]]
    if not there:
        # Set on purpose: not the default, which `reproduce` and `export` read back from the
        # session's settings.json as if it had been given.
        default = type(settings).model_fields["submodule_path"].default
        if "submodule_path" in settings.model_fields_set and path != default:
            listed = ", ".join(sorted(at[bad])) or "none"
            raise BadInput(
                f"{settings.given_as('submodule_path')} {path}: neither end of the range has a "
                f"submodule there (the known-bad commit has: {listed}); name the runtime's path "
                "as .gitmodules gives it"
            )
        # The default path, and the runtime elsewhere: every test would run without simpler.
        named = sorted(
            {
                entry.path
                for end in (bad, good)
                for entry in at[end].values()
                if "simpler" in (entry.name, entry.path.rsplit("/", 1)[-1])
            }
        )
        if named:
            raise BadInput(
                f"neither end of the range has a submodule at {path} (the default runtime path), "
                f"but simpler is a submodule at {' and '.join(named)}: pass --submodule-path "
                f"{named[0]}"
            )
        return
    if len(there) == 2:
        return
    have = there[0]
    lack = bad if have == good else good
    entry = at[have][path]
    elsewhere = [
        other.path
        for other in at[lack].values()
        if other.path != path
        and (other.name == entry.name or (entry.url is not None and other.url == entry.url))
    ]
    if not elsewhere:
        return  # added (or removed) within the range: the tests before it run without it
    chain = [good, *commits]
    pins = history.gitlinks(chain, path)
    index = next(i for i, c in enumerate(chain) if i and (pins[c] is None) != (pins[good] is None))
    mover, before = chain[index], chain[index - 1]
    ends = {good: "the known-good commit", bad: "the known-bad commit"}
    paths = {have: path, lack: elsewhere[0]}
    # No test compares commits across the move: each side is a range of its own, and the
    # mover is the culprit when the side before it passes at its end and it fails itself.
    sides = [
        f"--good {a[:12]} --bad {b[:12]} --submodule-path {paths[end]}"
        for a, b, end in ((good, before, good), (mover, bad, bad))
        if a != b
    ]
    each = f"bisect each side on its own ({'; '.join(sides)}): " if sides else ""
    # The pin on each side of the move, each read at its own path.
    old_pin = history.gitlink(before, paths[good])
    new_pin = history.gitlink(mover, paths[bad])
    bump = ""
    if old_pin is not None and new_pin is not None and old_pin != new_pin:
        bump = (
            f"; it also moves the pinned simpler {old_pin[:12]} -> {new_pin[:12]}, which "
            "neither side bisects: compare those simpler commits with pypto at "
            f"{mover[:12]} by hand"
        )
    raise BadInput(
        f"the runtime submodule moves within the range: it is at {path} at {ends[have]} and at "
        f"{elsewhere[0]} at {ends[lack]} ({mover[:12]} moves it), and no test compares commits "
        f"across that move; {each}when {before[:12]} passes and {mover[:12]} fails, "
        f"{mover[:12]} itself brought the regression{bump}"
    )


def prepare(settings: Settings) -> Prepared:
    pypto_path = _directory(settings.pypto, settings.given_as("pypto"), "the pypto checkout")
    history = History(pypto_path)
    extra = extra_repos(settings)
    lib = _directory(settings.lib, settings.given_as("lib"), "the pypto-lib checkout")
    script = _script(lib, settings.script, settings.given_as("script"))
    if not settings.known_good:
        raise BadInput(
            "no known-good commit: pass --good REV or set known_good in bisect-precision.toml"
        )
    good = history.resolve(settings.known_good)
    bad = history.resolve(settings.bad or "HEAD")
    # By the names the user gave: the messages about the range quote them.
    commits = history.first_parent_range(settings.known_good, settings.bad or "HEAD")
    _check_submodule_path(history, good, commits, settings)
    content: dict[str, str] = {}
    for key, root in (
        ("ptoas_root", settings.ptoas_root),
        ("pto_isa_root", settings.pto_isa_root),
    ):
        if root is not None and not root.expanduser().is_dir():
            raise BadInput(f"{settings.given_as(key)} {root}: no such directory")
        if root is not None:
            content[key] = tree_digest(root.expanduser())
    # The tool's own directories are no part of pypto-lib when a run starts from inside it.
    lib_exclude = (settings.workdir, settings.cache_root())
    lib_digest = tree_digest(lib, lib_exclude)
    patterns = VerdictPatterns.from_mapping(settings.verdict.model_dump(exclude_none=True))
    writable_directory(settings.workdir, settings.given_as("workdir"))
    cache_dir = writable_directory(settings.cache_root(), settings.given_as("cache_dir"))
    if settings.executor == "ray":
        # Ray picks the cards; each node checks its own devices when a run lands there.
        parse_device_map(settings.device_map)
        devices, slots = Passthrough(), []
    else:
        devices = passthrough(
            settings.device_mode, settings.platform, settings.devices, settings.device_map
        )
        slots = device_slots(settings)
    client = connect()
    image_id = base_image_id(client, settings.base_image, settings.given_as("base_image"))
    if settings.executor != "ray":
        _fits_the_engine(client, settings)
    _create(cache_dir, settings.cache_root(), settings.given_as("cache_dir"))
    workdir = settings.workdir.expanduser().resolve()
    _create(workdir, settings.workdir, settings.given_as("workdir"))
    for name in ("runs", SNAPSHOTS, "sessions"):  # what the workdir's own folders must be
        if (workdir / name).exists() and not (workdir / name).is_dir():
            raise BadInput(
                f"{settings.given_as('workdir')} {settings.workdir}: {workdir / name} is a file "
                "where the workdir keeps a folder; move it away"
            )
    cache_root = settings.cache_root().resolve()
    inputs = SessionInputs(
        pypto_repo=str(pypto_path),
        lib_repo=str(lib),
        script=script,
        good=good,
        bad=bad,
        platform=settings.platform,
        devices=settings.devices,
        base_image=settings.base_image,
        base_image_id=image_id,
        submodule_path=settings.submodule_path,
        extra_args=list(settings.extra_args),
        settings_digest=session_digest(settings, lib_digest, content),
    )
    exporter = SourceExporter(pypto_path, cache_root, extra, runtime=settings.submodule_path)
    skip = _skipped(settings, history, exporter, (good, bad))
    return Prepared(
        settings=settings,
        history=history,
        lib=lib,
        script=script,
        good=good,
        bad=bad,
        commits=commits,
        passthrough=devices,
        patterns=patterns,
        client=client,
        base_image_id=image_id,
        workdir=workdir,
        lib_digest=lib_digest,
        lib_exclude=lib_exclude,
        content=content,
        cache_root=cache_root,
        exporter=exporter,
        inputs=inputs,
        slots=slots,
        skip=skip,
        warnings=[
            *settings.overrides,
            *_unrelated_clones(history, (good, bad), extra),
            *_unused_settings(settings),
            *_skips_outside(settings, history, skip, commits),
            *_low_on_space(cache_root, settings.given_as("cache_dir")),
        ],
    )


# Below this, a cache cannot keep a real pypto's wheel (115 MB) and its ccache objects: builds
# still work, but every one compiles from scratch and ccache's figures come out incomplete.
LOW_CACHE_SPACE = 1 << 30


def _low_on_space(cache_root: Path, given_as: str) -> list[str]:
    """A warning when the cache's disk is nearly full: ccache fails there without a word."""
    try:
        usage = shutil.disk_usage(cache_root)
    except OSError:
        return []
    if usage.free >= LOW_CACHE_SPACE:
        return []
    return [
        f"the disk of the cache ({cache_root}) has {usage.free >> 20} MiB free: ccache and the "
        "wheel cache cannot keep what builds make there, so builds compile from scratch and "
        f"the ccache hit rates come out wrong; free space or point {given_as} at a larger disk"
    ]


def _skipped(
    settings: Settings, history: History, exporter: SourceExporter, ends: Sequence[str] = ()
) -> frozenset[str]:
    """--skip revisions as full SHAs: pypto's first, else its simpler submodule's. The range's
    `ends` cannot be skipped: the bisect starts from their verdicts."""
    shas = set()
    for rev in settings.skip:
        try:
            sha = history.resolve(rev)
        except BadInput:
            pass
        else:
            if sha in ends:
                raise BadInput(
                    f"{settings.given_as('skip')} {rev}: {sha[:12]} is an end of the range; move "
                    "--good or --bad instead"
                )
            shas.add(sha)
            continue
        try:
            simpler = History(exporter.submodule_git_dir(settings.submodule_path))
            shas.add(simpler.resolve(rev))
        except BisectError:
            raise BadInput(
                f"{settings.given_as('skip')} {rev}: no such commit in pypto or in its "
                f"{settings.submodule_path} submodule"
            ) from None
    return frozenset(shas)


def _skips_outside(
    settings: Settings, history: History, skip: frozenset[str], commits: Sequence[str]
) -> list[str]:
    """--skip values naming a pypto commit outside the range: they skip nothing (a typo, or
    a commit of another branch), which the user should hear of before the bisect runs."""
    inside = set(commits)
    warnings = []
    for rev in settings.skip:
        with contextlib.suppress(BadInput):
            sha = history.resolve(rev)
            if sha in skip and sha not in inside:
                warnings.append(
                    f"{settings.given_as('skip')} {rev}: pypto {sha[:12]} is not on the range's "
                    "first-parent chain; it skips nothing"
                )
    return warnings


def device_slots(settings: Settings, cores: int | None = None) -> list[Slot]:
    """One slot per card (or per `cards_per_test` cards), each with its own passthrough.

    Simulator platforms get one lane per --device value and, when there are several and no
    --cpus was given, an equal share of the host's CPUs each: the simulator hangs when its
    threads oversubscribe the CPUs.
    """
    names = [d.strip() for d in settings.devices if d.strip()]
    if is_simulator(settings.platform):
        if settings.cards_per_test != 1:
            raise BadInput(
                f"{settings.given_as('cards_per_test')} {settings.cards_per_test}: the simulator "
                "uses no cards; each --device value is one lane"
            )
        share = None
        if len(names) > 1 and settings.cpus is None:
            share = max(1.0, (cores or os.cpu_count() or 1) / len(names))
        return [Slot(device=name, cpus=settings.cpus or share) for name in names]
    size = settings.cards_per_test
    if len(names) % size:
        raise BadInput(
            f"--device names {len(names)} cards, not a multiple of --cards-per-test {size}"
        )
    slots = []
    for start in range(0, len(names), size):
        group = names[start : start + size]
        slots.append(
            Slot(
                device=",".join(group),
                passthrough=passthrough(
                    settings.device_mode, settings.platform, group, settings.device_map
                ),
            )
        )
    return slots
