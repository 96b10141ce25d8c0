"""Build pypto and simpler wheels in throw-away containers; keep them in a content-addressed cache.

The legacy builder behind docker-py has no BuildKit cache mounts, so wheels are built by a plain
container with a mounted ccache directory and only then copied into test images (see images.py).
A wheel depends on the commit, the image it was built in and the build recipe; the cache key covers
exactly those, so neighbouring bisects (and two runs at once) share every build. A commit whose
build genuinely fails is remembered as a failure: retrying it would only fail again, slowly.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import docker
from filelock import FileLock, Timeout

from runner.config import DEFAULT_BUILD_COMMAND, PEP517_FRONTEND_PATH
from runner.containers import ContainerSpec, Mount
from runner.errors import BuildTimedOut, InfrastructureError
from runner.execute import KIND_LABEL, LABEL, Cancelled, keep_explicit, run_container
from runner.files import write_text_atomic
from runner.sources import ExportResult

if TYPE_CHECKING:
    from runner.builders import Builder

# Bump when the in-container recipe below changes in a way that could change a wheel.
_RECIPE_VERSION = 3
_ENTRY_FORMAT = 1
_BUILD_DIR = "/tmp/bisect-build"  # fixed, so ccache sees the same paths for every commit
_STATS_LOG = "/out/.ccache-stats.log"
ZIP_EPOCH = 315532800
"""1980-01-01T00:00:00Z: the earliest time a ZIP archive (a wheel) can hold; wheel builders refuse
a SOURCE_DATE_EPOCH before it."""
# What ccache needs to serve neighbouring commits: a launcher for CMake (simpler's CMake sets
# none), paths relative to the fixed build directory, and scikit-build-core's build tree at a
# fixed place instead of a fresh temporary directory per build.
CCACHE_ENVIRONMENT = {
    "CCACHE_DIR": "/ccache",
    "CCACHE_BASEDIR": _BUILD_DIR,
    "CCACHE_NOHASHDIR": "1",
    "CCACHE_STATSLOG": _STATS_LOG,
    "CMAKE_C_COMPILER_LAUNCHER": "ccache",
    "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
    "SKBUILD_BUILD_DIR": f"{_BUILD_DIR}/.skbuild",
}
# The system's own words for a full disk (strerror, Python's errno), not the bare name ENOSPC:
# a configure check (`Looking for ENOSPC - found`) or a line of code may say that.
_ENOSPC = re.compile(
    r"no space left on device|disk quota exceeded|\[Errno (?:28|122)\]", re.IGNORECASE
)
_SOURCE_ECHO = re.compile(r"^\s*\d*\s*\|")  # gcc and clang quoting the line of code
_COMPILER_KILLED = re.compile(
    r"Killed signal terminated program|internal compiler error: Killed|fatal error: Killed"
)
# What a build that tried to download something says in a container without network.
_OFFLINE = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Name or service not known"
    r"|Network is unreachable|unable to access 'https?://|Failed to establish a new connection"
    r"|getaddrinfo failed|No address associated with hostname",
    re.IGNORECASE,
)
_STALE_TMP_SECONDS = 24 * 3600
_HEX_KEY = re.compile(r"[0-9a-f]{64}")

Echo = Callable[[str], None]


@dataclass(frozen=True)
class BuildSettings:
    """How wheels are built; everything except cpus, memory and timeout is part of the cache key."""

    base_image: str
    base_image_id: str
    command: str = DEFAULT_BUILD_COMMAND
    environment: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    network: bool = False
    omitted: tuple[str, ...] = ()  # submodules exported empty (--omit-submodule)
    # Mounted inputs by content (pto-isa's tree digest), so an updated pto-isa is a new key.
    content: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory: str | None = None  # Docker's --memory: "8g"
    timeout: float | None = 3600

    def __post_init__(self) -> None:
        object.__setattr__(self, "environment", dict(sorted(self.environment.items())))
        object.__setattr__(self, "mounts", tuple(self.mounts))
        object.__setattr__(self, "omitted", tuple(sorted(self.omitted)))
        object.__setattr__(self, "content", dict(sorted(self.content.items())))

    def summary(self) -> dict[str, object]:
        """The key-relevant settings, as recorded in each cache entry for `cache ls` and humans."""
        return {
            "base_image": self.base_image,
            "base_image_id": self.base_image_id,
            "command": self.command,
            "environment": dict(self.environment),
            "mounts": [[m.host, m.container, m.read_only] for m in self.mounts],
            "network": self.network,
            **({"omitted": list(self.omitted)} if self.omitted else {}),
            **({"content": dict(self.content)} if self.content else {}),
        }

    def digest(self) -> str:
        """Stable over runs; the image *name* is left out because only its id changes a wheel."""
        relevant = self.summary()
        del relevant["base_image"]
        relevant["recipe"] = _RECIPE_VERSION
        blob = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class WheelResult:
    package: str
    commit: str
    key: str
    ok: bool
    wheel: Path | None
    sha256: str | None
    log_path: Path
    seconds: float
    from_cache: bool
    reason: str
    builder: str | None = None
    ccache_hits: int | None = None
    ccache_misses: int | None = None
    export_s: float = 0.0


@dataclass(frozen=True)
class CacheEntry:
    key: str
    package: str
    commit: str
    ok: bool
    size: int
    created: datetime
    last_used: datetime
    wheel: str | None
    sha256: str | None
    reason: str
    path: Path
    builder: str | None = None
    wheel_size: int | None = None  # the wheel's bytes when it was cached
    # Submodules built at another commit than `commit` pins (path -> sha): see `WheelCache.key`
    inputs: Mapping[str, str] = field(default_factory=dict)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _intact(wheel: Path | None, size: int | None) -> bool:
    """A cached wheel is there, with the size it was cached with (when that was recorded)."""
    try:
        return wheel is not None and (size is None or wheel.stat().st_size == size)
    except OSError:
        return False


def dir_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


class WheelCache:
    """Wheels (and remembered build failures) on disk, one directory per key, LRU-pruned.

    Layout: `<root>/<key[:2]>/<key>/{entry.json, <wheel>, build.log}`; entries appear by an
    atomic rename from `<root>/.tmp`, and a per-key file lock in `<root>/.locks` makes two
    processes sharing the cache build a key once.
    """

    def __init__(self, root: Path, *, lease: bool = False) -> None:
        """`lease`: a session's cache, whose entries `prune` leaves alone while it runs."""
        self.root = Path(root)
        self._locks: dict[str, FileLock] = {}
        self._leasing = lease
        self._lease: FileLock | None = None
        self._leased: set[str] = set()
        self._lease_lock = threading.Lock()

    # -- paths and locks -------------------------------------------------------------------

    def key(
        self,
        package: str,
        commit: str,
        settings: BuildSettings,
        builder: str | None = None,
        inputs: Mapping[str, str] | None = None,
    ) -> str:
        """`builder`: the builder image's key (base image plus exact build tools), if any.
        `inputs`: submodules built at another commit than `commit` pins (path -> sha)."""
        fields: dict[str, object] = {
            "package": package,
            "commit": commit,
            "base_image_id": settings.base_image_id,
            "settings": settings.digest(),
        }
        if builder is not None:
            fields["builder"] = builder
        if inputs:
            fields["inputs"] = dict(sorted(inputs.items()))
        blob = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    @property
    def tmp_dir(self) -> Path:
        return self.root / ".tmp"

    @property
    def failed_log_dir(self) -> Path:
        """Logs of failures that are not cached (timeouts, OOM kills): kept for the user to read."""
        return self.root / ".logs"

    def _lock_for(self, key: str) -> FileLock:
        lock = self._locks.get(key)
        if lock is None:
            lock_dir = self.root / ".locks"
            try:
                lock_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise _infrastructure(exc, f"create the wheel cache at {self.root}") from exc
            lock = self._locks[key] = FileLock(str(lock_dir / f"{key}.lock"))
        return lock

    def locked(
        self, key: str, echo: Echo | None = None, stopping: Callable[[], bool] | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the key's lock; say so when another process is building the same wheel."""
        waiting = f"waiting for another run that is building cache entry {key[:12]} ..."
        return holding(self._lock_for(key), waiting, echo, stopping)

    # -- leases: what running sessions use -------------------------------------------------

    @property
    def lease_dir(self) -> Path:
        return self.root / ".leases"

    def use(self, key: str) -> None:
        """Note that this process uses the entry: `prune` keeps it while the process lives.

        A session may need a wheel again long after it first used it (a re-test, the drift
        check, a test image rebuilt), so pruning it mid-run would only make the run build it
        again. The lease is a list of keys beside a lock the process holds until `release`
        (or its death, which frees the lock), so a killed run leases nothing."""
        if not self._leasing:
            return
        with self._lease_lock:
            if key in self._leased:
                return
            try:
                if self._lease is None:
                    self.lease_dir.mkdir(parents=True, exist_ok=True)
                    stem = self.lease_dir / f"{os.getpid()}-{os.urandom(4).hex()}"
                    lock = FileLock(str(stem.with_suffix(".lock")))
                    lock.acquire(timeout=0)
                    self._lease = lock
                keys = Path(self._lease.lock_file).with_suffix(".keys")
                with keys.open("a") as listed:
                    listed.write(key + "\n")
            except (OSError, Timeout):
                return  # a read-only cache: nothing to prune there either
            self._leased.add(key)

    def release(self) -> None:
        """End this process's lease (the session is over)."""
        with self._lease_lock:
            lock, self._lease = self._lease, None
            self._leased.clear()
        if lock is not None:
            Path(lock.lock_file).with_suffix(".keys").unlink(missing_ok=True)
            lock.release()
            Path(lock.lock_file).unlink(missing_ok=True)

    def leased(self) -> set[str]:
        """Keys some running process uses; leases of processes that died are removed."""
        keys: set[str] = set()
        if not self.lease_dir.is_dir():
            return keys
        for lock_path in self.lease_dir.glob("*.lock"):
            listed = lock_path.with_suffix(".keys")
            probe = FileLock(str(lock_path))
            try:
                probe.acquire(timeout=0)
            except Timeout:  # alive
                with contextlib.suppress(OSError):
                    keys.update(listed.read_text().split())
                continue
            try:  # nobody holds it: a finished or killed process's
                listed.unlink(missing_ok=True)
                lock_path.unlink(missing_ok=True)
            except OSError:
                pass
            finally:
                probe.release()
        return keys

    # -- reading ---------------------------------------------------------------------------

    def _read_entry(self, key: str) -> CacheEntry | None:
        path = self.entry_dir(key)
        try:
            data = json.loads((path / "entry.json").read_text())
            return CacheEntry(
                key=key,
                package=str(data["package"]),
                commit=str(data["commit"]),
                ok=bool(data["ok"]),
                size=dir_size(path),
                created=datetime.fromisoformat(data["created"]),
                last_used=datetime.fromisoformat(data["last_used"]),
                wheel=data.get("wheel"),
                sha256=data.get("sha256"),
                reason=str(data.get("reason", "")),
                path=path,
                builder=data.get("builder"),
                wheel_size=data.get("size") if data.get("wheel") else None,
                inputs=dict(data.get("inputs") or {}),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def lookup(
        self,
        package: str,
        commit: str,
        settings: BuildSettings,
        builder: str | None = None,
        inputs: Mapping[str, str] | None = None,
    ) -> WheelResult | None:
        """The cached wheel or failure for this build, marked as just used; None on a miss."""
        key = self.key(package, commit, settings, builder, inputs)
        with self.locked(key):
            return self._lookup_locked(key)

    def _lookup_locked(self, key: str) -> WheelResult | None:
        path = self.entry_dir(key)
        if not path.exists():
            return None
        entry = self._read_entry(key)
        wheel = path / entry.wheel if entry and entry.wheel else None
        if entry is None or (entry.ok and not _intact(wheel, entry.wheel_size)):
            # Half-deleted, truncated or corrupt by hand: a miss, and it is rebuilt.
            self._discard(path)
            return None
        self._touch(path)
        self.use(key)
        return WheelResult(
            package=entry.package,
            commit=entry.commit,
            key=key,
            ok=entry.ok,
            wheel=wheel if entry.ok else None,
            sha256=entry.sha256 if entry.ok else None,
            log_path=path / "build.log",
            seconds=0.0,
            from_cache=True,
            reason=entry.reason,
            builder=entry.builder,
        )

    def _touch(self, path: Path) -> None:
        try:
            meta = path / "entry.json"
            data = json.loads(meta.read_text())
            data["last_used"] = _now().isoformat()
            write_json_atomic(meta, data)
        except (OSError, ValueError):
            pass  # LRU bookkeeping only; a read-only or full cache still serves its wheels

    def entries(self) -> list[CacheEntry]:
        """Every readable entry, least recently used first."""
        found: list[CacheEntry] = []
        if not self.root.is_dir():
            return found
        for meta in self.root.glob("??/*/entry.json"):
            entry = self._read_entry(meta.parent.name)
            if entry is not None:
                found.append(entry)
        return sorted(found, key=lambda e: (e.last_used, e.key))

    def size(self) -> int:
        return sum(e.size for e in self.entries())

    def discard_if_damaged(self, result: WheelResult) -> bool:
        """Whether the cached wheel of `result` no longer has the digest recorded when it was
        cached (a disk error, a hand edit); such an entry is removed, to be built again. A full
        read of the wheel: called when a wheel fails to install, not on every use."""
        if result.wheel is None or result.sha256 is None:
            return False
        with self.locked(result.key):
            try:
                damaged = file_sha256(result.wheel) != result.sha256
            except OSError:
                damaged = True
            if damaged and self.entry_dir(result.key).exists():
                self._discard(self.entry_dir(result.key))
        return damaged

    # -- removing --------------------------------------------------------------------------

    def _discard(self, path: Path) -> None:
        """Rename first so a reader never sees half an entry, then delete at leisure."""
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            trash = Path(tempfile.mkdtemp(prefix=f"trash-{path.name[:12]}-", dir=self.tmp_dir))
            os.replace(path, trash / "entry")
            shutil.rmtree(trash, ignore_errors=True)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _infrastructure(exc, f"remove cache entry {path}") from exc

    def _remove(self, entries: list[CacheEntry]) -> list[CacheEntry]:
        removed = []
        for entry in entries:
            lock = self._lock_for(entry.key)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue  # in use by a running build; leave it
            try:
                self._discard(entry.path)
                removed.append(entry)
            finally:
                lock.release()
        return removed

    def prune(self, max_bytes: int | None = None) -> list[CacheEntry]:
        """Drop least recently used entries until the cache fits max_bytes (None: drop all),
        except those a running session uses (`in_use`): those count, and stay."""
        self.sweep_leftovers()
        used = self.leased()
        entries = self.entries()
        candidates = [e for e in entries if e.key not in used]
        if max_bytes is None:
            return self._remove(candidates)
        total = sum(e.size for e in entries)
        victims = []
        for entry in candidates:
            if total <= max_bytes:
                break
            victims.append(entry)
            total -= entry.size
        return self._remove(victims)

    def in_use(self) -> list[CacheEntry]:
        """The entries running sessions use, which `prune` keeps."""
        used = self.leased()
        return [e for e in self.entries() if e.key in used]

    def remove_failures(self) -> list[CacheEntry]:
        """Forget remembered failures, e.g. after fixing the build environment."""
        return self._remove([e for e in self.entries() if not e.ok])

    def sweep_leftovers(self) -> None:
        """Remove what killed runs left in `.tmp`: a build's staging directory (a whole source
        export and build tree) once nobody holds its key's lock, removed entries (trash)
        always, and anything else after a day."""
        if not self.tmp_dir.is_dir():
            return
        cutoff = time.time() - _STALE_TMP_SECONDS
        for child in self.tmp_dir.iterdir():
            with contextlib.suppress(OSError):
                kind, _, rest = child.name.partition("-")
                key = rest.split("-", 1)[0]
                if (
                    kind == "trash"
                    or (kind == "build" and _HEX_KEY.fullmatch(key) and self._idle(key))
                    or child.stat().st_mtime < cutoff
                ):
                    shutil.rmtree(child, ignore_errors=True)

    def _idle(self, key: str) -> bool:
        """Whether no build of `key` runs now, in any process (this one included: a lock object
        of its own conflicts with the one a build holds)."""
        probe = FileLock(str(self.root / ".locks" / f"{key}.lock"))
        try:
            probe.acquire(timeout=0)
        except Timeout:
            return False
        probe.release()
        return True


def _infrastructure(exc: OSError, doing: str) -> InfrastructureError:
    if exc.errno == errno.ENOSPC:
        return InfrastructureError(
            f"no space left on device while trying to {doing}; free disk space or prune the "
            "cache (`cache prune --max-size ...`) and resume"
        )
    return InfrastructureError(f"could not {doing}: {exc}; check the cache directory and resume")


_DIAGNOSTIC = re.compile(
    r"^\S+?:\d+(?::\d+)?: (?:fatal )?error: "  # file:line[:col]: error: (gcc, clang, nvcc)
    r"|^\S+?\(\d+\): error"  # file(line): error (msvc style)
    r"|.*undefined reference to "  # ld
    r"|^ld(?:\.\w+)?: .*cannot find -l"
)
_PIP_NOISE = re.compile(
    r"^(error: (subprocess-exited-with-error|metadata-generation-failed)"
    r"|ERROR: Failed (building wheel|to build)|note: |hint: |[\u00d7\u2570\u2502]"
    r"|.*finished with status 'error'$|-- Configuring incomplete, errors occurred)",
    re.IGNORECASE,
)


def wheel_id(commit: str, inputs: Mapping[str, str] | None = None) -> str:
    """One wheel of a package: its commit, and the submodule commits it was built with when
    they are not the ones `commit` pins (`inputs`, see `WheelCache.key`)."""
    if not inputs:
        return commit
    return "+".join([commit, *(f"{path}@{sha}" for path, sha in sorted(inputs.items()))])


def ran_out_of_space(output: str) -> bool:
    """Whether a failed build's log says the disk was full (not that its code mentions it)."""
    return any(
        _ENOSPC.search(line) and not _SOURCE_ECHO.match(line) for line in output.splitlines()
    )


def last_error_line(output: str) -> str:
    """The line a human would look for first: the last specific error, not pip's epilogue.

    CMake writes where (`CMake Error at CMakeLists.txt:7 (find_package):`) and what (indented
    below it) on separate lines: the reason joins them.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    # A compiler's or linker's own diagnostic beats the driver's epilogue (`error: command gcc
    # failed`, `collect2: error: ld returned 1`), and the first one is the cause of the rest.
    cause = next((line for line in lines if _DIAGNOSTIC.match(line)), None)
    if cause is not None:
        return cause[:300]
    # So does CMake's first error, with its message (the indented paragraph below it), over
    # the traceback of the setup.py that ran CMake (`CalledProcessError: ... exit status 1`).
    raw = output.expandtabs().splitlines()
    first = next((i for i, r in enumerate(raw) if r.lstrip().startswith("CMake Error")), None)
    if first is not None:
        indent = len(raw[first]) - len(raw[first].lstrip())
        said = [raw[first].strip()]
        for line in raw[first + 1 :]:
            if not line.strip() or len(line) - len(line.lstrip()) <= indent:
                break
            said.append(line.strip())
        return " ".join(said)[:300]
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if not re.search("error", line, re.IGNORECASE) or _PIP_NOISE.match(line):
            continue
        if line.startswith("CMake Error") and line.endswith(":") and index + 1 < len(lines):
            return f"{line} {lines[index + 1]}"[:300]
        above = lines[max(0, index - 5) : index]
        header = next((h for h in reversed(above) if h.startswith("CMake Error")), None)
        if header is not None and header.endswith(":"):
            return f"{header} {line}"[:300]
        return line[:300]
    return lines[-1][:300] if lines else "no output"


PEP517_FRONTEND = '''\
"""Build the project in the working directory into a wheel in sys.argv[1] with its PEP 517
backend, as `pip wheel --no-deps --no-build-isolation --no-index` does, in one process and
without pip's own start-up and metadata pass (it costs as long as a small build)."""
import importlib
import os
import sys

out = os.path.abspath(sys.argv[1])
try:
    import tomllib
except ImportError:  # before Python 3.11: the reader scikit-build-core installs there
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None
if tomllib is None:  # nothing reads TOML here (never import pip: setuptools then breaks)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    os.execv(sys.executable, pip + ["--no-index", "-w", out, "."])
system = {}
if os.path.exists("pyproject.toml"):
    with open("pyproject.toml", "rb") as text:
        system = tomllib.load(text).get("build-system", {})
name = system.get("build-backend", "setuptools.build_meta:__legacy__")
for entry in reversed(system.get("backend-path", [])):
    sys.path.insert(0, os.path.abspath(entry))
module, _, attributes = name.partition(":")
backend = importlib.import_module(module)
for attribute in filter(None, attributes.split(".")):
    backend = getattr(backend, attribute)
if not os.path.isdir(out):
    os.makedirs(out)
print("Successfully built " + backend.build_wheel(out), flush=True)
'''


def _builder_script(command: str) -> str:
    """pip writes build/ and *.egg-info into the tree, so build in a copy of the read-only /src;
    the default command's PEP 517 frontend is written first."""
    lines = [
        "set -e",
        f"cat > {PEP517_FRONTEND_PATH} <<'BISECT_PEP517_FRONTEND'",
        PEP517_FRONTEND.rstrip("\n"),
        "BISECT_PEP517_FRONTEND",
        f"rm -rf {_BUILD_DIR} && mkdir -p {_BUILD_DIR}",
        f"cp -a /src/. {_BUILD_DIR}/",
        f"cd {_BUILD_DIR}",
        command,
    ]
    return "\n".join(lines) + "\n"


def _caller_owner() -> tuple[int, int] | None:
    """The calling user, root included: a base image's own USER (a vendor image's service
    account, say) could not write /out or the cache."""
    if not hasattr(os, "getuid"):
        return None
    return os.getuid(), os.getgid()


SPECULATIVE_SHARES = 128  # an eighth of a needed build's weight under contention


def builder_spec(
    package: str,
    commit: str,
    key: str,
    settings: BuildSettings,
    *,
    src: Path,
    out: Path,
    ccache_dir: Path,
    image: str | None = None,
    parallel: int | None = None,
    speculative: bool = False,
    source_date: int | None = None,
) -> ContainerSpec:
    """The builder container: sources read-only, network off unless asked, ccache shared.

    `parallel`: compile jobs when several builds share the host (never part of the cache key:
    it changes how fast a wheel is made, not what is in it). A `speculative` build gets a small
    CPU weight, so it uses idle cores but yields them to the builds a test is waiting for.
    `source_date`: the commit's time, given as SOURCE_DATE_EPOCH (a `--build-env` one wins), so
    the wheel's timestamps come from the commit and a rebuild of the same sources with the same
    tools is the same file: `reproduce` can tell a rebuilt wheel from a different one.

    It runs as the calling user, so whatever a killed build leaves in the cache is theirs.
    """
    environment = {
        "HOME": "/tmp",
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
        # (no earlier than 1980: a ZIP archive, which a wheel is, cannot hold an older time)
        **(
            {"SOURCE_DATE_EPOCH": str(max(source_date, ZIP_EPOCH))}
            if source_date is not None
            else {}
        ),
        **CCACHE_ENVIRONMENT,
        **settings.environment,
    }
    if settings.cpus:
        environment.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(max(1, round(settings.cpus))))
    if parallel:
        environment.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(parallel))
    mounts = [
        Mount(host=str(src), container="/src", read_only=True),
        Mount(host=str(out), container="/out", read_only=False),
        Mount(host=str(ccache_dir), container="/ccache", read_only=False),
        *settings.mounts,
    ]
    owner = _caller_owner()
    return ContainerSpec(
        image=image or settings.base_image_id or settings.base_image,
        command=[*keep_explicit(environment), "sh", "-c", _builder_script(settings.command)],
        environment=environment,
        mounts=mounts,
        devices=[],
        network=settings.network,
        working_dir=None,
        cpus=settings.cpus,
        cpu_shares=SPECULATIVE_SHARES if speculative else None,
        mem_limit=settings.memory,
        labels={
            LABEL: "1",
            KIND_LABEL: "wheel-build",
            f"{LABEL}.package": package,
            f"{LABEL}.commit": commit,
            f"{LABEL}.key": key,
        },
        user=f"{owner[0]}:{owner[1]}" if owner else None,
    )


@contextlib.contextmanager
def holding(
    lock: FileLock,
    waiting: str,
    echo: Echo | None = None,
    stopping: Callable[[], bool] | None = None,
) -> Iterator[None]:
    """Hold a lock another run sharing the cache may hold; `echo` hears `waiting` while it does.
    When `stopping` says so, the wait ends in `Cancelled`: another run's build may take
    minutes, and a stopping process waits for the thread that waits here."""
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if echo:
            echo(waiting)
        while True:
            if stopping is not None and stopping():
                raise Cancelled("the run is stopping") from None
            try:
                lock.acquire(timeout=0.2)
                break
            except Timeout:
                continue
    try:
        yield
    finally:
        lock.release()


def ccache_counts(stats_log: Path) -> tuple[int, int] | None:
    """(hits, misses) of one build from ccache's statistics log; None when ccache never ran."""
    try:
        text = stats_log.read_text(errors="replace")
    except OSError:
        return None
    hits = misses = 0
    for line in text.splitlines():
        word = line.strip()
        if word in {"direct_cache_hit", "preprocessed_cache_hit"}:
            hits += 1
        elif word == "cache_miss":
            misses += 1
    return (hits, misses) if hits or misses else None


def build_wheel(
    client: docker.DockerClient,
    cache: WheelCache,
    package: str,
    commit: str,
    prepare_source: Callable[[Path], object],
    settings: BuildSettings,
    *,
    ccache_dir: Path,
    builder: Builder | None = None,
    echo: Echo | None = None,
    cancel: threading.Event | None = None,
    parallel: int | None = None,
    speculative: bool = False,
    inputs: Mapping[str, str] | None = None,
) -> WheelResult:
    """The wheel of `package` at `commit`, from the cache or built now in `builder`'s image.
    `inputs`: submodules `prepare_source` exports at another commit than `commit` pins.

    Setting `cancel` kills the build's container and raises `Cancelled`; the build directory is
    removed and nothing reaches the cache.

    `prepare_source(dir)` fills an empty directory with the commit's sources; it is only called
    on a miss. When it returns the `ExportResult`, the build gets the commit's time as
    SOURCE_DATE_EPOCH. Build failures are cached; engine, disk and timeout failures raise
    InfrastructureError instead, since another attempt may well succeed.
    """
    key = cache.key(package, commit, settings, builder.key if builder else None, inputs)
    with cache.locked(key, echo, cancel.is_set if cancel is not None else None):
        hit = cache._lookup_locked(key)
        if hit is not None:
            return hit
        try:
            cache.tmp_dir.mkdir(parents=True, exist_ok=True)
            # The whole key names the directory: a sweep finds its lock (`sweep_leftovers`).
            work = Path(tempfile.mkdtemp(prefix=f"build-{key}-", dir=cache.tmp_dir))
        except OSError as exc:
            raise _infrastructure(exc, f"create a build directory in {cache.root}") from exc
        try:
            return _build(
                client,
                cache,
                key,
                package,
                commit,
                prepare_source,
                settings,
                work=work,
                ccache_dir=ccache_dir,
                builder=builder,
                echo=echo,
                cancel=cancel,
                parallel=parallel,
                speculative=speculative,
                inputs=inputs,
            )
        except OSError as exc:
            raise _infrastructure(exc, f"build the {package} wheel for {commit[:12]}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _build(
    client: docker.DockerClient,
    cache: WheelCache,
    key: str,
    package: str,
    commit: str,
    prepare_source: Callable[[Path], object],
    settings: BuildSettings,
    *,
    work: Path,
    ccache_dir: Path,
    builder: Builder | None,
    echo: Echo | None,
    cancel: threading.Event | None = None,
    parallel: int | None = None,
    speculative: bool = False,
    inputs: Mapping[str, str] | None = None,
) -> WheelResult:
    src, out, staged = work / "src", work / "out", work / "entry"
    for directory in (src, out, staged):
        directory.mkdir()
    ccache_dir = Path(ccache_dir).resolve()
    ccache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    exported = prepare_source(src)
    export_s = time.monotonic() - started

    spec = builder_spec(
        package,
        commit,
        key,
        settings,
        src=src.resolve(),
        out=out.resolve(),
        ccache_dir=ccache_dir,
        image=builder.image_id if builder else None,
        parallel=parallel,
        speculative=speculative,
        source_date=exported.committed if isinstance(exported, ExportResult) else None,
    )
    log_path = staged / "build.log"
    started = time.monotonic()
    result = run_container(
        client, spec, log_path=log_path, timeout=settings.timeout, echo=echo, cancel=cancel
    )
    seconds = time.monotonic() - started

    killed = result.exit_code == 137  # SIGKILL: the kernel's OOM killer outside a memory limit
    # The OOM killer may take a compiler rather than the container: make or ninja then fail
    # with the driver's "Killed signal terminated program cc1plus".
    killed = killed or (
        result.exit_code != 0 and _COMPILER_KILLED.search(result.output) is not None
    )
    out_of_space = result.exit_code != 0 and ran_out_of_space(result.output)
    if result.timed_out or result.oom_killed or killed or out_of_space:
        # Says nothing about the commit: keep the log outside the cache and let a retry build it.
        cache.failed_log_dir.mkdir(parents=True, exist_ok=True)
        kept_log = cache.failed_log_dir / f"{key}.log"
        shutil.copyfile(log_path, kept_log)
        if result.timed_out:
            why = f"timed out after {settings.timeout:g}s"
        elif out_of_space:
            why = "ran out of disk space"
        elif result.oom_killed and settings.memory:
            why = f"ran out of memory under its {settings.memory} limit (--memory)"
        else:
            why = "was killed (out of memory?)"
        text = f"the {package} build of {commit[:12]} {why}; not a verdict (log: {kept_log})"
        if result.timed_out:
            raise BuildTimedOut(text, package, commit, settings.timeout or 0.0, str(kept_log))
        raise InfrastructureError(text)

    wheels = sorted(out.glob("*.whl"))
    counts = ccache_counts(out / Path(_STATS_LOG).name)
    wheel_name: str | None = None
    sha256: str | None = None
    reason = ""
    if result.exit_code != 0:
        reason = f"build failed (exit {result.exit_code}): {last_error_line(result.output)}"
        if not settings.network and _OFFLINE.search(result.output):
            reason += (
                " (the build tried to reach the network, and builds have none: give it what it "
                "fetches, e.g. --pto-isa-root for simpler's pto-isa, or allow --build-network)"
            )
    elif len(wheels) != 1:
        names = ", ".join(w.name for w in wheels) or "none"
        reason = f"build failed (exit 0): expected exactly one wheel in /out, found {names}"
    else:
        wheel_name = wheels[0].name
        sha256 = file_sha256(wheels[0])
        shutil.move(str(wheels[0]), staged / wheel_name)

    stamp = _now().isoformat()
    write_json_atomic(
        staged / "entry.json",
        {
            "format": _ENTRY_FORMAT,
            "key": key,
            "package": package,
            "commit": commit,
            "ok": wheel_name is not None,
            "wheel": wheel_name,
            "sha256": sha256,
            "size": (staged / wheel_name).stat().st_size if wheel_name else 0,
            "seconds": round(seconds, 3),
            "created": stamp,
            "last_used": stamp,
            "reason": reason,
            "settings": settings.summary(),
            "builder": builder.image_id if builder else None,
            "build_tools": list(builder.tools) if builder else None,
            "ccache": list(counts) if counts else None,
            "inputs": dict(inputs) if inputs else None,
        },
    )
    final = cache.entry_dir(key)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, final)
    cache.use(key)
    return WheelResult(
        package=package,
        commit=commit,
        key=key,
        ok=wheel_name is not None,
        wheel=final / wheel_name if wheel_name else None,
        sha256=sha256,
        log_path=final / "build.log",
        seconds=seconds,
        from_cache=False,
        reason=reason,
        builder=builder.image_id if builder else None,
        ccache_hits=counts[0] if counts else None,
        ccache_misses=counts[1] if counts else None,
        export_s=export_s,
    )
