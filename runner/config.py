"""Settings from flags, the config file and the environment, in that order of precedence.

Every flag of `run` has a key in `bisect-precision.toml` (the working directory's, or `--config`),
so a team can keep the slow-changing choices (base image, device mode, known-good commit) in a file
next to the workdir and pass only what changes on the command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runner.errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_NAME = "bisect-precision.toml"
# Paths in the config file are relative to the file, not to where the command runs.
PATH_KEYS = {"pypto", "simpler", "lib", "workdir", "cache_dir", "ptoas_root", "pto_isa_root"}
ENV_PREFIX = "BISECT_PRECISION_"
CACHE_ENV = "BISECT_PRECISION_CACHE"
DEFAULT_BASE_IMAGE = "quay.io/ascend/cann:9.0.0-910b-ubuntu22.04-py3.12"
DEFAULT_RUN_ENV = {
    "PTO2_RING_DEP_POOL": "16384",
    "PTO2_RING_TASK_WINDOW": "16384",
    "PTO2_RING_HEAP": "1073741824",
}
DEFAULT_BUILD_COMMAND = "python3 -m pip wheel --no-deps --no-build-isolation --no-index -w /out ."


class VerdictConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    good: list[str] | None = None
    bad: list[str] | None = None


class Settings(BaseModel):
    """Everything a bisect needs; the CLI makes paths absolute before a session starts."""

    pypto: Path | None = None
    simpler: Path | None = None  # another simpler clone, for objects the pypto checkout lacks
    lib: Path | None = None
    script: str | None = None
    known_good: str | None = Field(default=None, alias="good")
    bad: str | None = None
    platform: str = "a2a3"
    device: str = "0"
    base_image: str = DEFAULT_BASE_IMAGE
    workdir: Path = Path("bisect-precision")
    cache_dir: Path | None = None
    submodule_path: str = "runtime"
    timeout: float = 1800.0
    build_timeout: float = 3600.0
    device_mode: Literal["explicit", "privileged", "ascend-runtime"] = "explicit"
    device_map: list[str] = Field(default_factory=list)
    build_network: bool = False
    build_command: str = DEFAULT_BUILD_COMMAND
    build_env: dict[str, str] = Field(default_factory=dict)
    run_env: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_RUN_ENV))
    ascend_home_path: str | None = None
    ptoas_root: Path | None = None
    pto_isa_root: Path | None = None
    extra_args: list[str] = Field(default_factory=list)
    python: str = "python3"
    cpus: float | None = None
    verify: bool = True
    verdict: VerdictConfig = Field(default_factory=VerdictConfig)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("platform")
    @classmethod
    def _platform(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError("platform must be a word such as a2a3, a5, a2a3sim or a5sim")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        parts = [p.strip() for p in str(value).split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"device must be a card number or a comma list of them, not {value!r}")
        return ",".join(parts)

    @field_validator("run_env")
    @classmethod
    def _run_env(cls, value: dict[str, str]) -> dict[str, str]:
        """pypto's CI ring sizes stay unless overridden; an empty value removes a variable."""
        merged = {**DEFAULT_RUN_ENV, **{k: str(v) for k, v in value.items()}}
        return {key: text for key, text in merged.items() if text != ""}

    @field_validator("timeout", "build_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("timeouts must be positive seconds")
        return value

    @property
    def devices(self) -> list[str]:
        return self.device.split(",")

    def cache_root(self) -> Path:
        return default_cache_dir() if self.cache_dir is None else self.cache_dir.expanduser()

    def run_digest(self) -> str:
        """What can change a verdict besides the commits: the ledger refuses to mix two of these."""
        keys = {
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
        blob = json.dumps(keys, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("bisect-precision-docker"))


def read_config_file(path: Path | None) -> dict[str, Any]:
    """The config file as a dict; a named file must exist, the default one may be absent."""
    explicit = path is not None
    path = path if path is not None else Path.cwd() / CONFIG_NAME
    if not path.exists():
        if explicit:
            raise BadInput(f"config file {path} does not exist")
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"config file {path} is not valid TOML: {exc}") from exc
    data = {key.replace("-", "_"): value for key, value in data.items()}
    for key in PATH_KEYS & data.keys():
        if isinstance(data[key], str):
            data[key] = str(path.parent / Path(data[key]).expanduser())
    return data


def environment_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """BISECT_PRECISION_<KEY> for scalar settings (the cache variable is handled on its own)."""
    environ = dict(os.environ) if environ is None else environ
    scalar = {
        name
        for name, field in Settings.model_fields.items()
        if field.annotation in (str, float, bool, Path, str | None, Path | None, float | None)
    }
    result: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or key == CACHE_ENV:
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in scalar:
            result[name] = value
    return result


def load_settings(flags: dict[str, Any], config_path: Path | None = None) -> Settings:
    """Merge defaults < config file < environment < flags (flags whose value is None are unset)."""
    merged: dict[str, Any] = {}
    merged.update(read_config_file(config_path))
    merged.update(environment_overrides())
    merged.update({key: value for key, value in flags.items() if value is not None})
    if "good" in merged:
        merged.setdefault("known_good", merged.pop("good"))
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling in the config file)"
        raise BadInput(f"{where}: {message}") from exc
