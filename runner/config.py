"""Settings from flags, `BISECT_PRECISION_*` environment variables and the config file, in that
order of precedence.

Every setting can come from any of the three, so a team keeps the slow-changing choices (base
image, device mode, known-good commit, build pins) in `bisect-precision.toml` next to the workdir,
a CI job overrides one through its environment, and a user passes only what changes on the
command line. pydantic-settings does the layering and the type checks; this module adds what it
cannot know: paths in the file are relative to the file, `good` is a short name for `known_good`,
and an error names where the bad value came from (a flag, a variable, or the file and its key).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import re
import sys
import typing
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any, Literal

import platformdirs
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from runner.errors import BadInput
from runner.verdict import Tolerance

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_NAME = "bisect-precision.toml"
ENV_PREFIX = "BISECT_PRECISION_"
CACHE_ENV = "BISECT_PRECISION_CACHE"
CONFIG_ENV = "BISECT_PRECISION_CONFIG"
DEFAULT_BASE_IMAGE = "quay.io/ascend/cann:9.0.0-910b-ubuntu22.04-py3.12"
DEFAULT_RUN_ENV = {
    "PTO2_RING_DEP_POOL": "16384",
    "PTO2_RING_TASK_WINDOW": "16384",
    "PTO2_RING_HEAP": "1073741824",
}
PEP517_FRONTEND_PATH = "/tmp/bisect-pep517.py"
"""Written into every build container (`runner.wheels.PEP517_FRONTEND`): the project's PEP 517
backend called directly, as `pip wheel --no-deps --no-build-isolation` would call it."""
DEFAULT_BUILD_COMMAND = f"python3 {PEP517_FRONTEND_PATH} /out"

FLAG_NAMES = {
    "known_good": "--good",
    "device_map": "--device-map",
    "extra_args": "--extra-arg",
    "submodule_sources": "--submodule-source",
    "omit_submodules": "--omit-submodule",
    "skip": "--skip",
    "build_pins": "--build-pin",
    "build_env": "--build-env",
    "run_env": "--run-env",
    "verdict": "--verdict-good/--verdict-bad",
    "build_network": "--build-network/--no-build-network",
    "resolve_by_date": "--resolve-by-date/--no-resolve-by-date",
    "verify": "--verify/--no-verify",
    "drift_check": "--drift-check/--no-drift-check",
    "prefetch": "--prefetch/--no-prefetch",
}
"""Flags whose name is not the setting's name with dashes (lists take one item per flag)."""

MAX_BUILD_JOBS = 256
"""More wheel builds at once than any host runs; each has a worker thread or two waiting."""
_HEX = re.compile(r"^[0-9a-f]{4,64}$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([bkmg]?)b?$")
MIN_MEMORY = 6 * 2**20
"""Docker refuses a container limited to less memory than this."""
MIN_CPUS = 0.01
"""Nor to fewer CPUs: a CFS quota of 1 ms per 100 ms period is the kernel's least."""


def memory_bytes(value: str) -> int:
    """Bytes in a memory size as Docker's --memory takes it: 8g, 512m, 1.5g, 1048576."""
    found = _MEMORY.match(value.strip().lower())
    if not found:
        raise ValueError(f"memory {value!r} is not a size such as 8g or 512m")
    return int(float(found[1]) * 1024 ** "bkmg".index(found[2] or "b"))


class VerdictConfig(BaseModel):
    """Output patterns (regular expressions) that replace the built-in pass and failure ones."""

    model_config = ConfigDict(extra="forbid")

    good: list[str] | None = Field(
        default=None, description="Regexes (multiline) that mark a pass."
    )
    bad: list[str] | None = Field(
        default=None, description="Regexes that mark a precision failure."
    )

    @field_validator("good", "bad")
    @classmethod
    def _regexes(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or []:
            try:
                re.compile(pattern, re.MULTILINE)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r} ({exc})") from None
        return value


class BuildPin(BaseModel):
    """Build tools to install for some commits, because newer tools break older commits.

    A pin applies to a commit of `package` (both when unset) whose SHA starts with one of
    `commits`, or whose commit date lies in `since`..`until` (inclusive); a pin with neither
    applies to every commit.
    """

    model_config = ConfigDict(extra="forbid")

    requirements: list[str] = Field(
        min_length=1,
        description="PEP 508 requirements to install, e.g. `scikit-build-core==0.12.2`.",
    )
    package: Literal["pypto", "simpler"] | None = Field(
        default=None, description="`pypto` or `simpler`; both when left out."
    )
    since: date | None = Field(
        default=None, description="First commit date the pin applies to (inclusive)."
    )
    until: date | None = Field(
        default=None, description="Last commit date the pin applies to (inclusive)."
    )
    commits: list[str] = Field(
        default_factory=list, description="Commit SHAs or prefixes (4+ hex digits)."
    )

    @field_validator("requirements")
    @classmethod
    def _pep508(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                Requirement(text)
            except InvalidRequirement as exc:
                first = str(exc).splitlines()[0]
                raise ValueError(
                    f"{text!r} is not a PEP 508 requirement such as "
                    f"'scikit-build-core==0.12.2' ({first})"
                ) from None
        return value

    @field_validator("commits")
    @classmethod
    def _shas(cls, value: list[str]) -> list[str]:
        for sha in value:
            if not _HEX.match(sha):
                raise ValueError(f"{sha!r} is not a commit SHA or a prefix of 4 or more hex digits")
        return value

    @model_validator(mode="after")
    def _range(self) -> BuildPin:
        if self.since and self.until and self.since > self.until:
            raise ValueError(f"since {self.since} is after until {self.until}")
        return self

    def applies(self, package: str, commit: str, committed: date) -> bool:
        if self.package is not None and self.package != package:
            return False
        if any(commit.startswith(prefix) for prefix in self.commits):
            return True
        dated = self.since is not None or self.until is not None
        if dated:
            return (self.since is None or self.since <= committed) and (
                self.until is None or committed <= self.until
            )
        return not self.commits


_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "bisect_precision_config_file", default=None
)


class _FileSource(PydanticBaseSettingsSource):
    """The config file (the lowest layer): `--config`, else $BISECT_PRECISION_CONFIG, else
    ./bisect-precision.toml when present."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = config_file_path(_CONFIG_FILE.get())
        data = read_config_file(path)
        # A table key given a plain value would be dropped without a word when a flag gives
        # the same table (the flag's wins whole): refuse it here, whatever the flags say.
        for key in sorted(_table_keys() & data.keys()):
            if not isinstance(data[key], dict):
                raise BadInput(
                    f"{path}: {key}: expected a table ([{key}] with KEY = value lines), got "
                    f"{data[key]!r}"
                )
        return data


def _table_keys() -> set[str]:
    tables = set()
    for name, field in Settings.model_fields.items():
        kind = field.annotation
        if typing.get_origin(kind) is dict or (
            isinstance(kind, type) and issubclass(kind, BaseModel)
        ):
            tables.add(name)
    return tables


def _submodule_path(path: str) -> str:
    """A submodule path as git lists it: `./runtime/` (what tab completion gives) is `runtime`,
    `third_party//runtime` is `third_party/runtime`."""
    cleaned = path.strip()
    if not cleaned or cleaned.startswith("/"):
        raise ValueError(f"{path!r} is not a submodule path inside the checkout")
    parts = [part for part in cleaned.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"{path!r} is not a submodule path inside the checkout")
    return "/".join(parts)


class Settings(BaseSettings):
    """Everything a bisect needs; the CLI makes paths absolute before a session starts."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
        allow_inf_nan=False,  # `--confidence nan` is a typo, not a setting
    )

    # How each setting that did not come from a flag was given, for messages about its value:
    # its environment variable, or the config file and key (see `given_as`).
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    # Flags that override another value the environment or config file gives (a warning).
    _overrides: list[str] = PrivateAttr(default_factory=list)

    pypto: Path | None = Field(default=None, description="The pypto checkout (only read).")
    simpler: Path | None = Field(
        default=None,
        description="A simpler clone with commits the checkout's submodule lacks; shorthand "
        "for a `submodule_sources` entry at `submodule_path` (given both, both are searched).",
    )
    lib: Path | None = Field(
        default=None, description="The pypto-lib checkout with the example (only read)."
    )
    script: str | None = Field(default=None, description="The example, relative to `lib`.")
    known_good: str | None = Field(
        default=None, description="Known-good pypto revision (`good` in the file works too)."
    )
    bad: str | None = Field(default=None, description="Known-bad revision [HEAD of `pypto`].")
    platform: str = Field(default="a2a3", description="a2a3, a5 (NPU) or a2a3sim, a5sim.")
    device: str = Field(
        default="0",
        description="NPU card number, or a comma list of them: each card (or group of "
        "`cards_per_test` cards) tests one commit per round. Simulator platforms: one lane each.",
    )
    cards_per_test: int = Field(
        default=1, ge=1, description="Cards one example run needs (a distributed example)."
    )
    build_jobs: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BUILD_JOBS,
        description="Wheel builds at once, speculative ones included [from the cores and memory].",
    )
    prefetch: bool = Field(
        default=True,
        description="While an example runs, build what the next rounds may test.",
    )
    executor: Literal["local", "ray"] = Field(
        default="local",
        description="Where builds and runs happen: this host, or a Ray cluster (the `ray` extra).",
    )
    ray_address: str = Field(
        default="auto", description='The Ray cluster to join with `executor = "ray"`.'
    )
    base_image: str = Field(
        default=DEFAULT_BASE_IMAGE, description="CANN-based image to build and run in."
    )
    workdir: Path = Field(
        default=Path("bisect-precision"),
        description="Holds ledger.json, runs/, report.md and report.json.",
    )
    cache_dir: Path | None = Field(
        default=None,
        description=f"Wheel cache and source mirrors [${CACHE_ENV} or the user cache dir].",
    )
    submodule_path: str = Field(default="runtime", description="Path of the simpler gitlink.")
    submodule_sources: dict[str, Path] = Field(
        default_factory=dict,
        description="Submodule path to a clone holding commits the checkout lacks.",
    )
    skip: list[str] = Field(
        default_factory=list,
        description="pypto or simpler commits taken as untestable, as `git bisect skip` does "
        "(a build that hangs).",
    )
    omit_submodules: list[str] = Field(
        default_factory=list,
        description="Submodule paths left out of source exports (their pinned commit is "
        "unavailable and the build does not need them).",
    )
    timeout: float = Field(default=1800.0, description="Seconds per example run.")
    build_timeout: float = Field(default=3600.0, description="Seconds per wheel build.")
    infra_retries: int = Field(
        default=3,
        description="Consecutive infrastructure failures tolerated before a run stops (exit 4).",
    )
    device_mode: Literal["explicit", "privileged", "ascend-runtime"] = Field(
        default="explicit", description="How NPUs reach the containers."
    )
    device_map: list[str] = Field(
        default_factory=list,
        description="HOST:CONTAINER devices to pass instead of the NPU set.",
    )
    build_network: bool = Field(default=False, description="Allow network during builds.")
    build_command: str = Field(
        default=DEFAULT_BUILD_COMMAND,
        description="Builds a wheel into /out from the source (the default calls the project's "
        "PEP 517 backend as `pip wheel --no-deps --no-build-isolation` would).",
    )
    build_env: dict[str, str] = Field(
        default_factory=dict, description="Environment of the build containers."
    )
    build_pins: list[BuildPin] = Field(
        default_factory=list,
        description="Build tools per commit range (see [[build_pins]] below).",
    )
    resolve_by_date: bool = Field(
        default=True,
        description="Pick build tools released before each commit's date, where the index "
        "says when.",
    )
    wheelhouse: Path | None = Field(
        default=None,
        description="A directory of wheels to provision build environments offline.",
    )
    run_env: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_RUN_ENV),
        description="Environment of the example runs, over pypto CI's PTO2_RING_* sizes "
        "(an empty value removes one).",
    )
    ascend_home_path: str | None = Field(
        default=None, description="ASCEND_HOME_PATH inside the containers."
    )
    ptoas_root: Path | None = Field(
        default=None, description="ptoas install mounted read-only for runs."
    )
    pto_isa_root: Path | None = Field(
        default=None, description="pto-isa checkout mounted read-only for builds and runs."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Extra arguments for the example."
    )
    python: str = Field(default="python3", description="Python in the image.")
    cpus: float | None = Field(default=None, description="CPU limit per container.")
    memory: str | None = Field(
        default=None,
        description="Memory limit per build and example container, as Docker writes it (8g, "
        "512m); one that runs out is an infrastructure fault, never a verdict.",
    )
    verify: bool = Field(default=True, description="Check that good is good and bad is bad first.")
    confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1.0,
        description="Stop when the likeliest culprit reaches this probability (flaky examples "
        "are re-tested until then).",
    )
    repeat: int | None = Field(
        default=None,
        ge=1,
        description="Run every tested commit this many times and judge by `policy` instead of "
        "the confidence search.",
    )
    policy: Literal["any-fail", "majority"] = Field(
        default="majority", description="How `repeat` runs make one verdict."
    )
    max_mismatch_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Judge by the figures: bad when more than this share of elements mismatch.",
    )
    max_abs_diff: float | None = Field(
        default=None, ge=0, description="Judge by the figures: bad above this max abs diff."
    )
    max_rel_diff: float | None = Field(
        default=None, ge=0, description="Judge by the figures: bad above this max rel diff."
    )
    drift_check: bool = Field(
        default=True,
        description="At the end, check that good commits still pass: the last good one runs "
        "last (a third time), else the known-good commit and the last good one are re-run; bad "
        "now means the environment drifted (exit 3).",
    )
    verdict: VerdictConfig = Field(
        default_factory=VerdictConfig,
        description="Regular expressions that replace the built-in pass and failure patterns.",
    )

    def tolerance(self) -> Tolerance | None:
        """The limits that judge attempts instead of the example's PASS/FAIL, when any is set."""
        limits = Tolerance(self.max_mismatch_ratio, self.max_abs_diff, self.max_rel_diff)
        return limits if limits.active else None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    @field_validator("platform")
    @classmethod
    def _platform(cls, value: str) -> str:
        # A typo (a2a3simm) would otherwise run as an NPU platform and blame the device.
        if value not in PLATFORMS:
            raise ValueError(
                f"unknown platform {value!r}: pypto-lib's platforms are a2a3, a5 (NPU) and "
                "a2a3sim, a5sim (simulator)"
            )
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, value: Any) -> str:
        parts = [p.strip() for p in str(value).split(",")]
        # ASCII digits only: an Arabic-Indic one is a digit to Python, not to the example's `-d`.
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(f"device must be a card number or a comma list of them, not {value!r}")
        cards = [int(p) for p in parts]
        twice = sorted(card for card, n in Counter(cards).items() if n > 1)
        if twice:
            # Two lanes on one card would run two examples on it at once.
            raise ValueError(f"device lists card {twice[0]} more than once: {value!r}")
        # "01" is card 1: the example is told `-d 1`, as /dev/davinci1 is checked and passed.
        return ",".join(str(card) for card in cards)

    @field_validator("device_map")
    @classmethod
    def _device_map(cls, value: list[str]) -> list[str]:
        from runner.devices import parse_device_map  # the one rule, for flags and the file

        try:
            parse_device_map(value)
        except BadInput as exc:
            raise ValueError(str(exc).removeprefix("--device-map ")) from None
        return value

    @field_validator("run_env")
    @classmethod
    def _run_env(cls, value: dict[str, str]) -> dict[str, str]:
        """pypto's CI ring sizes stay unless overridden; an empty value removes a variable."""
        merged = {**DEFAULT_RUN_ENV, **{k: str(v) for k, v in value.items()}}
        return {key: text for key, text in merged.items() if text != ""}

    @field_serializer("run_env")
    def _run_env_removals(self, value: dict[str, str]) -> dict[str, str]:
        """A default removed by "" stays removed when the settings are saved and read back
        (settings.json, for `reproduce` and `export`): the validator merges the defaults in."""
        return {**value, **{key: "" for key in DEFAULT_RUN_ENV if key not in value}}

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        """`build_timeout = true` would be 1 second: TOML's true is no number."""
        if isinstance(value, bool) and info.field_name in _NUMBER_FIELDS:
            raise ValueError(f"{info.field_name} must be a number, not {str(value).lower()}")
        return value

    @field_validator("timeout", "build_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("timeouts must be positive seconds")
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("cpus must be a positive number of CPUs")
        if value is not None and value < MIN_CPUS:
            # The kernel's CFS quota takes 1 ms per 100 ms at least: Docker refuses less at
            # every container start, which would stop the run as an infrastructure fault.
            raise ValueError(f"cpus {value:g} is below the {MIN_CPUS:g} CPUs a container can have")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().lower()
        if memory_bytes(value) < MIN_MEMORY:
            raise ValueError(f"memory {value!r} is below Docker's minimum of 6m")
        return value

    @field_validator("infra_retries")
    @classmethod
    def _retries(cls, value: int) -> int:
        if value < 1:
            raise ValueError("infra_retries must be 1 or more")
        return value

    @field_validator("submodule_sources")
    @classmethod
    def _sources(cls, value: dict[str, Path]) -> dict[str, Path]:
        sources: dict[str, Path] = {}
        for given, clone in value.items():
            path = _submodule_path(given)
            other = sources.setdefault(path, clone)
            if other != clone:  # `runtime` and `./runtime/`: one would be dropped
                raise ValueError(
                    f"two clones for the submodule at {path} ({other} and "
                    f"{clone}): give one per path (for the runtime, --simpler adds a second)"
                )
        return sources

    @field_validator("submodule_path")
    @classmethod
    def _runtime_path(cls, value: str) -> str:
        return _submodule_path(value)

    @field_validator("omit_submodules")
    @classmethod
    def _omitted(cls, value: list[str]) -> list[str]:
        return [_submodule_path(path) for path in value]

    @property
    def devices(self) -> list[str]:
        return self.device.split(",")

    def submodule_repos(self) -> dict[str, tuple[Path, ...]]:
        """Submodule path -> the clones to take its objects from; `simpler` stands for one of the
        runtime's. Given beside a `submodule_sources` entry for the runtime (upstream and a fork,
        say), both are used: commits pinned from either history are found."""
        repos = {path: (clone,) for path, clone in self.submodule_sources.items()}
        path = self.submodule_path
        if self.simpler is not None:
            given = repos.get(path, ())
            mine = self.simpler.expanduser().absolute()
            if all(clone.expanduser().absolute() != mine for clone in given):
                repos[path] = (self.simpler, *given)
        if path in self.omit_submodules:
            raise BadInput(
                f"{self.given_as('omit_submodules')} {path}: the {path} submodule is simpler, "
                "which every test builds, so it cannot be left out; give a clone that has its "
                f"commits with {self.given_as('simpler')} DIR"
            )
        return repos

    def cache_root(self) -> Path:
        return default_cache_dir() if self.cache_dir is None else self.cache_dir.expanduser()

    @property
    def overrides(self) -> list[str]:
        """Flags that hide another value of the environment or the config file."""
        return list(self._overrides)

    def given_as(self, key: str) -> str:
        """Where the user set `key`, to open a message about its value: the flag (also the
        default's name), else the environment variable, else the config file and key."""
        return self._origins.get(key) or flag_name(key)

    def run_digest(self) -> str:
        """What can change a verdict besides the commits: the ledger refuses to mix two of these."""
        keys: dict[str, Any] = {
            "build_command": self.build_command,
            "build_env": self.build_env,
            "build_network": self.build_network,
            "run_env": self.run_env,
            "ascend_home_path": self.ascend_home_path,
            "ptoas_root": str(self.ptoas_root) if self.ptoas_root else None,
            "pto_isa_root": str(self.pto_isa_root) if self.pto_isa_root else None,
            "python": self.python,
            "device_mode": self.device_mode,
            "verdict": self.verdict.model_dump(),
        }
        # Newer keys join only when set, so ledgers of earlier versions keep their digest.
        if self.build_pins:
            keys["build_pins"] = [pin.model_dump(mode="json") for pin in self.build_pins]
        if not self.resolve_by_date:
            keys["resolve_by_date"] = False
        if self.omit_submodules:
            keys["omit_submodules"] = sorted(self.omit_submodules)
        blob = json.dumps(keys, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _number(annotation: Any) -> bool:
    """int or float, alone or optional: a field TOML's booleans must not fill."""
    kinds = set(typing.get_args(annotation)) or {annotation}
    return bool(kinds & {int, float}) and bool not in kinds


_NUMBER_FIELDS = {name for name, f in Settings.model_fields.items() if _number(f.annotation)}

PATH_KEYS = {
    name for name, field in Settings.model_fields.items() if field.annotation in (Path, Path | None)
}
"""Paths in the config file are relative to the file, not to where the command runs."""


PLATFORMS = ("a2a3", "a5", "a2a3sim", "a5sim")
"""pypto-lib's `-p` values: two NPU generations and their CPU simulators."""


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("bisect-precision-docker"))


def config_file_path(path: Path | None) -> Path | None:
    """The file to read: the named one (which must exist), else the working directory's."""
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    if path is not None:
        if not path.exists():
            raise BadInput(f"config file {path} does not exist")
        return path
    default = Path.cwd() / CONFIG_NAME
    return default if default.exists() else None


def read_config_file(path: Path | None) -> dict[str, Any]:
    """The config file as a dict of settings, its relative paths made relative to the file."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"config file {path} is not valid TOML: {exc}") from exc
    spelt: dict[str, str] = {}
    for key in data:
        name = key.replace("-", "_")
        name = "known_good" if name == "good" else name
        if name in spelt:
            raise BadInput(
                f"{path}: {spelt[name]} and {key} are the same setting; keep one of them"
            )
        spelt[name] = key
    data = {name: data[key] for name, key in spelt.items()}
    base = path.parent
    for key in PATH_KEYS & data.keys():
        if isinstance(data[key], str):
            data[key] = str(base / Path(data[key]).expanduser())
    sources = data.get("submodule_sources")
    if isinstance(sources, dict):
        data["submodule_sources"] = {
            sub: str(base / Path(value).expanduser()) if isinstance(value, str) else value
            for sub, value in sources.items()
        }
    return data


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _env_values() -> dict[str, str]:
    """This process's BISECT_PRECISION_<SETTING> variables, by setting name."""
    upper = {key.upper(): value for key, value in os.environ.items()}
    return {
        name: upper[env_name(name)] for name in Settings.model_fields if env_name(name) in upper
    }


def _check_env_json() -> None:
    """Lists and tables in the environment are JSON: name the variable when one is not."""
    source = EnvSettingsSource(Settings)
    for name, text in _env_values().items():
        field = Settings.model_fields[name]
        if not source.field_is_complex(field):
            continue
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(
                f"{env_name(name)}: not valid JSON ({exc.msg} at character {exc.pos}); lists "
                'and tables are JSON in the environment, e.g. \'["a", "b"]\' or \'{"KEY": "v"}\''
            ) from None


def _check_env_names() -> None:
    """A misspelt BISECT_PRECISION_* variable is an error, not a setting silently left out."""
    known = {env_name(name) for name in Settings.model_fields} | {CACHE_ENV, CONFIG_ENV}
    for key in sorted(os.environ):
        if key.upper().startswith(ENV_PREFIX) and key.upper() not in known:
            raise BadInput(
                f"{key}: no such setting; the variables are {ENV_PREFIX}<KEY> for the keys in "
                "docs/config.md (`bisect-precision-docker config-reference`)"
            )


def flag_name(field: str) -> str:
    return FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def _where(loc: tuple, flags: dict[str, Any], env: dict[str, str], file: Path | None) -> str:
    """Name the source of the value at `loc`: the flag, the variable, or the file and key."""
    name = str(loc[0]) if loc else ""
    key = ".".join(str(part) for part in loc) or "settings"
    if name in flags:
        return flag_name(name) if len(loc) == 1 else f"{flag_name(name)} ({key})"
    if name in env:
        return env_name(name) if len(loc) == 1 else f"{env_name(name)} ({key})"
    if file is not None:
        return f"{file}: {key}"
    return key


def _overridden(
    settings: Settings,
    given: dict[str, Any],
    env: dict[str, str],
    in_file: dict[str, Any],
    file: Path | None,
) -> list[str]:
    """A flag wins over the environment and the config file: name each plain value it hides
    that differs from its own, so that a key set in the file is never ignored without a word
    (tables merge key by key, so nothing of theirs is hidden)."""
    notes = []
    tables = _table_keys()
    source = EnvSettingsSource(Settings)
    for name in sorted(given.keys() - tables):
        ours = getattr(settings, name)
        from_env: Any = env.get(name)
        if from_env is not None and source.field_is_complex(Settings.model_fields[name]):
            from_env = json.loads(from_env)  # checked by _check_env_json
        for hidden, template, where in (
            (from_env, "{env}={value}", env_name(name)),
            (in_file.get(name), "{name} = {value} in {file}", f"{file}: {name}"),
        ):
            if hidden is not None and _validated(name, hidden, where) != ours:
                what = template.format(
                    env=env_name(name), name=name, value=_shown(hidden), file=file
                )
                notes.append(f"{flag_name(name)} {_shown(ours)} overrides {what}")
    return notes


def _validated(name: str, value: Any, where: str) -> Any:
    """`value` as the setting `name` would hold it (a list as given, a path made absolute).
    A flag hid it, so nothing else checks it: a wrong value is still a mistake in the file or
    the environment, named by `where`, and would bite the next run without the flag."""
    try:
        return getattr(_absolute(Settings(**{name: value})), name)
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise BadInput(f"{where}: {message}") from None


def _shown(value: Any) -> str:
    """A setting's value as the user writes it: a table (a build pin) as the flag's JSON."""
    if isinstance(value, (list, tuple)):
        return ",".join(_shown(item) for item in value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


def _absolute(settings: Settings) -> Settings:
    """Every path made absolute from where the command runs: the saved settings must find the
    same directories when `reproduce` or `export` runs from elsewhere."""
    changes: dict[str, Any] = {
        key: Path(value).expanduser().absolute()
        for key in PATH_KEYS
        if (value := getattr(settings, key)) is not None
    }
    changes["submodule_sources"] = {
        path: Path(clone).expanduser().absolute()
        for path, clone in settings.submodule_sources.items()
    }
    return settings.model_copy(update=changes)


def load_settings(flags: dict[str, Any], config_path: Path | None = None) -> Settings:
    """Merge defaults < config file < environment < flags (flags whose value is None are unset)."""
    given = {key: value for key, value in flags.items() if value is not None}
    if "good" in given:
        given.setdefault("known_good", given.pop("good"))
    unknown = sorted(set(given) - set(Settings.model_fields))
    if unknown:
        raise BadInput(f"unknown setting {unknown[0]!r}")
    file = config_file_path(config_path)
    _check_env_names()
    _check_env_json()
    token = _CONFIG_FILE.set(file)
    try:
        settings = _absolute(Settings(**given))
        env = _env_values()
        in_file = read_config_file(file)
        settings._overrides = _overridden(settings, given, env, in_file, file)
        settings._origins = {
            name: _where((name,), given, env, file)
            for name in Settings.model_fields
            if name not in given and (name in env or name in in_file)
        }
        return settings
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _where(tuple(first["loc"]), given, _env_values(), file)
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; see docs/config.md)"
        raise BadInput(f"{where}: {message}") from exc
    except SettingsError as exc:
        raise BadInput(f"settings: {str(exc).splitlines()[0]}") from exc
    finally:
        _CONFIG_FILE.reset(token)
