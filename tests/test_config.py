"""Settings: flags win over the environment, which wins over the config file."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from runner.config import (
    DEFAULT_BUILD_COMMAND,
    DEFAULT_RUN_ENV,
    BuildPin,
    Settings,
    VerdictConfig,
    flag_name,
    load_settings,
)
from runner.errors import BadInput
from runner.prepare import prepare
from runner.reference import config_reference


def test_flags_override_environment_which_overrides_the_file(tmp_path, monkeypatch):
    config = tmp_path / "bisect-precision.toml"
    config.write_text('platform = "a5"\ndevice = "1"\ntimeout = 60\nknown_good = "v1"\n')
    monkeypatch.setenv("BISECT_PRECISION_DEVICE", "2")
    monkeypatch.setenv("BISECT_PRECISION_TIMEOUT", "90")

    settings = load_settings({"timeout": 30.0}, config)

    assert settings.platform == "a5"
    assert settings.device == "2"
    assert settings.timeout == 30.0
    assert settings.known_good == "v1"


def test_paths_in_the_config_file_are_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "team").mkdir()
    config = tmp_path / "team" / "bisect-precision.toml"
    config.write_text('pypto = "../pypto"\nworkdir = "runs"\n')
    monkeypatch.chdir(tmp_path)

    settings = load_settings({}, config)

    assert settings.pypto.resolve() == (tmp_path / "pypto").resolve()
    assert settings.workdir == tmp_path / "team" / "runs"


def test_the_config_file_in_the_working_directory_is_read_when_present(tmp_path, monkeypatch):
    (tmp_path / "bisect-precision.toml").write_text('base_image = "cann:local"\n')
    monkeypatch.chdir(tmp_path)

    assert load_settings({}).base_image == "cann:local"


def test_the_cache_directory_comes_from_its_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("BISECT_PRECISION_CACHE", str(tmp_path / "c"))
    assert load_settings({}).cache_root() == tmp_path / "c"
    assert load_settings({"cache_dir": Path("/x")}).cache_root() == Path("/x")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('platfrom = "a5"', "platfrom"),
        ("timeout = -1", "timeout"),
        ('device_mode = "root"', "device_mode"),
        ("this is not toml", "not valid TOML"),
        ('[verdict]\nugly = ["x"]', "verdict.ugly"),
        ('good = "v1"\nknown_good = "v2"', "good and known_good are the same setting"),
        ('cache-dir = "a"\ncache_dir = "b"', "cache-dir and cache_dir are the same setting"),
    ],
)
def test_bad_config_files_are_named_in_one_line(tmp_path, text, fragment):
    config = tmp_path / "c.toml"
    config.write_text(text)
    with pytest.raises(BadInput) as raised:
        load_settings({}, config)
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_named_config_file_must_exist(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load_settings({}, tmp_path / "missing.toml")


def test_the_run_digest_changes_with_settings_that_can_change_a_verdict():
    base = load_settings({})
    assert base.run_digest() == load_settings({"timeout": 5.0}).run_digest()
    assert base.run_digest() != load_settings({"run_env": {"X": "1"}}).run_digest()
    assert base.run_digest() != load_settings({"build_network": True}).run_digest()


def test_run_environment_keeps_the_ring_defaults_unless_overridden_or_emptied(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[run_env]\nPTO2_RING_HEAP = "2147483648"\nPTO2_RING_DEP_POOL = ""\nX = "1"\n'
    )

    env = load_settings({}, config).run_env

    assert env["PTO2_RING_HEAP"] == "2147483648"
    assert env["PTO2_RING_TASK_WINDOW"] == "16384"
    assert "PTO2_RING_DEP_POOL" not in env
    assert env["X"] == "1"


# One value per setting, as the environment, the config file and the model see it. A new setting
# without a row fails `test_every_setting_has_a_row`: each must be settable in all three places.
ROWS: dict[str, tuple[str, str, object]] = {
    "pypto": ("/src/pypto", 'pypto = "/src/pypto"', Path("/src/pypto")),
    "simpler": ("/src/simpler", 'simpler = "/src/simpler"', Path("/src/simpler")),
    "lib": ("/src/lib", 'lib = "/src/lib"', Path("/src/lib")),
    "script": ("models/x.py", 'script = "models/x.py"', "models/x.py"),
    "known_good": ("v1.0", 'known_good = "v1.0"', "v1.0"),
    "bad": ("v2.0", 'bad = "v2.0"', "v2.0"),
    "platform": ("a5sim", 'platform = "a5sim"', "a5sim"),
    "device": ("2,3", 'device = "2,3"', "2,3"),
    "base_image": ("cann:x", 'base_image = "cann:x"', "cann:x"),
    "workdir": ("/w", 'workdir = "/w"', Path("/w")),
    "cache_dir": ("/c", 'cache_dir = "/c"', Path("/c")),
    "submodule_path": ("rt", 'submodule_path = "rt"', "rt"),
    "submodule_sources": (
        '{"3rdparty/x": "/m/x"}',
        '[submodule_sources]\n"3rdparty/x" = "/m/x"',
        {"3rdparty/x": Path("/m/x")},
    ),
    "omit_submodules": ('["3rdparty/a"]', 'omit_submodules = ["3rdparty/a"]', ["3rdparty/a"]),
    "skip": ('["v1.0", "abc1234"]', 'skip = ["v1.0", "abc1234"]', ["v1.0", "abc1234"]),
    "timeout": ("12.5", "timeout = 12.5", 12.5),
    "build_timeout": ("99", "build_timeout = 99", 99.0),
    "infra_retries": ("7", "infra_retries = 7", 7),
    "device_mode": ("privileged", 'device_mode = "privileged"', "privileged"),
    "device_map": (
        '["/dev/null:/dev/x"]',
        'device_map = ["/dev/null:/dev/x"]',
        ["/dev/null:/dev/x"],
    ),
    "build_network": ("true", "build_network = true", True),
    "build_command": ("make wheel", 'build_command = "make wheel"', "make wheel"),
    "build_env": ('{"CC": "clang"}', '[build_env]\nCC = "clang"', {"CC": "clang"}),
    "build_pins": (
        '[{"requirements": ["ninja==1.11.1"], "package": "pypto", "until": "2026-03-01"}]',
        '[[build_pins]]\nrequirements = ["ninja==1.11.1"]\npackage = "pypto"\nuntil = 2026-03-01',
        [
            BuildPin(
                requirements=["ninja==1.11.1"], package="pypto", until=datetime.date(2026, 3, 1)
            )
        ],
    ),
    "resolve_by_date": ("false", "resolve_by_date = false", False),
    "wheelhouse": ("/wh", 'wheelhouse = "/wh"', Path("/wh")),
    "run_env": ('{"PTO2_RING_HEAP": ""}', '[run_env]\nPTO2_RING_HEAP = ""', None),
    "ascend_home_path": ("/usr/ascend", 'ascend_home_path = "/usr/ascend"', "/usr/ascend"),
    "ptoas_root": ("/p", 'ptoas_root = "/p"', Path("/p")),
    "pto_isa_root": ("/i", 'pto_isa_root = "/i"', Path("/i")),
    "extra_args": ('["--n", "4"]', 'extra_args = ["--n", "4"]', ["--n", "4"]),
    "python": ("python3.12", 'python = "python3.12"', "python3.12"),
    "cpus": ("1.5", "cpus = 1.5", 1.5),
    "memory": ("8G", 'memory = "8g"', "8g"),
    "cards_per_test": ("2", "cards_per_test = 2", 2),
    "build_jobs": ("3", "build_jobs = 3", 3),
    "prefetch": ("false", "prefetch = false", False),
    "executor": ("ray", 'executor = "ray"', "ray"),
    "ray_address": ("head:6379", 'ray_address = "head:6379"', "head:6379"),
    "verify": ("false", "verify = false", False),
    "confidence": ("0.99", "confidence = 0.99", 0.99),
    "repeat": ("3", "repeat = 3", 3),
    "policy": ("any-fail", 'policy = "any-fail"', "any-fail"),
    "max_mismatch_ratio": ("0.01", "max_mismatch_ratio = 0.01", 0.01),
    "max_abs_diff": ("0.005", "max_abs_diff = 0.005", 0.005),
    "max_rel_diff": ("0.1", "max_rel_diff = 0.1", 0.1),
    "drift_check": ("false", "drift_check = false", False),
    "verdict": ('{"bad": ["BOOM"]}', '[verdict]\nbad = ["BOOM"]', VerdictConfig(bad=["BOOM"])),
}


def _expected(name: str, value: object) -> object:
    if name == "run_env":
        return {k: v for k, v in DEFAULT_RUN_ENV.items() if k != "PTO2_RING_HEAP"}
    return value


def test_every_setting_has_a_row():
    assert set(ROWS) == set(Settings.model_fields)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_setting_can_come_from_the_environment_alone(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(f"BISECT_PRECISION_{name.upper()}", ROWS[name][0])
    settings = load_settings({})
    assert getattr(settings, name) == _expected(name, ROWS[name][2])
    default = Settings.model_fields[name].get_default(call_default_factory=True)
    assert getattr(settings, name) != default


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_setting_can_come_from_the_config_file(name, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(ROWS[name][1] + "\n")
    assert getattr(load_settings({}, config), name) == _expected(name, ROWS[name][2])


def test_a_list_from_the_environment_overrides_the_file_and_a_flag_overrides_both(
    tmp_path, monkeypatch
):
    config = tmp_path / "c.toml"
    config.write_text('extra_args = ["file"]\ndevice_mode = "ascend-runtime"\n')
    monkeypatch.setenv("BISECT_PRECISION_EXTRA_ARGS", '["env"]')
    monkeypatch.setenv("BISECT_PRECISION_DEVICE_MODE", "privileged")

    assert load_settings({}, config).extra_args == ["env"]
    assert load_settings({}, config).device_mode == "privileged"
    assert load_settings({"extra_args": ["flag"]}, config).extra_args == ["flag"]


def test_a_flag_that_hides_a_different_value_of_the_environment_or_the_file_is_named(
    tmp_path, monkeypatch
):
    config = tmp_path / "c.toml"
    config.write_text(
        'platform = "a5"\ndevice = "1"\ntimeout = 60\nextra_args = ["file"]\n'
        'cache_dir = "c"\n[build_env]\nA = "file"\n'
    )
    monkeypatch.setenv("BISECT_PRECISION_DEVICE", "2, 3")
    monkeypatch.setenv("BISECT_PRECISION_EXTRA_ARGS", '["flag"]')
    flags = {
        "platform": "a2a3",
        "device": "2,3",  # as the environment gives it: only the file's value is hidden
        "timeout": 60.0,  # the file's value, spelt otherwise
        "extra_args": ["flag"],
        "cache_dir": tmp_path / "c",  # the file's relative path, resolved
        "build_env": {"B": "flag"},  # tables merge: nothing hidden
    }

    settings = load_settings(flags, config)

    assert settings.overrides == [
        f"--device 2,3 overrides device = 1 in {config}",
        f"--extra-arg flag overrides extra_args = file in {config}",
        f"--platform a2a3 overrides platform = a5 in {config}",
    ]
    assert load_settings({}, config).overrides == []
    assert load_settings({"platform": "a5"}, config).overrides == []


def test_the_good_alias_works_in_the_file_and_the_config_file_can_come_from_the_environment(
    tmp_path, monkeypatch
):
    config = tmp_path / "team.toml"
    config.write_text('good = "v1"\nwheelhouse = "wheels"\n[submodule_sources]\nruntime = "s"\n')
    monkeypatch.setenv("BISECT_PRECISION_CONFIG", str(config))

    settings = load_settings({})

    assert settings.known_good == "v1"
    assert settings.wheelhouse == tmp_path / "wheels"
    assert settings.submodule_sources == {"runtime": tmp_path / "s"}


@pytest.mark.parametrize(
    ("env", "flags", "file", "expected"),
    [
        ({"BISECT_PRECISION_DEVICE_MODE": "root"}, {}, "", "BISECT_PRECISION_DEVICE_MODE: "),
        (
            {"BISECT_PRECISION_DEVICE_MAP": "/dev/x"},
            {},
            "",
            "BISECT_PRECISION_DEVICE_MAP: not valid JSON",
        ),
        (
            {"BISECT_PRECISION_INFRA_RETRIES": "0"},
            {},
            "",
            "BISECT_PRECISION_INFRA_RETRIES: infra_retries must be 1",
        ),
        ({}, {"infra_retries": 0}, "", "--infra-retries: "),
        ({}, {"extra_args": [3]}, "", "--extra-arg (extra_args.0): "),
        (
            {},
            {},
            "[[build_pins]]\nrequirements = ['not a requirement!']",
            "c.toml: build_pins.0.requirements: ",
        ),
        (
            {},
            {},
            "[[build_pins]]\nrequirements = ['x']\ncommits = ['zz']",
            "c.toml: build_pins.0.commits: ",
        ),
        (
            {},
            {},
            "[[build_pins]]\nrequirements = ['x']\nsince = 2026-02-01\nuntil = 2026-01-01",
            "since 2026-02-01 is after",
        ),
        ({}, {}, "[[build_pins]]\nrequirements = []", "c.toml: build_pins.0.requirements: "),
        (
            {},
            {},
            "[[build_pins]]\nrequirements = ['x']\npackage = 'ptoas'",
            "c.toml: build_pins.0.package: ",
        ),
        ({}, {}, "[submodule_sources]\n'../up' = 'x'", "c.toml: submodule_sources: "),
        ({}, {}, "infra_retries = 'many'", "c.toml: infra_retries: "),
        ({}, {}, "build_timeout = true", "c.toml: build_timeout: build_timeout must be a number"),
        ({}, {}, "cpus = true", "c.toml: cpus: cpus must be a number, not true"),
        ({}, {}, "repeat = false", "c.toml: repeat: repeat must be a number, not false"),
        ({}, {"confidence": float("nan")}, "", "--confidence: Input should be a finite number"),
        ({"BISECT_PRECISION_TIMEOUT": "inf"}, {}, "", "BISECT_PRECISION_TIMEOUT: Input should"),
    ],
)
def test_a_bad_value_is_one_line_naming_where_it_came_from(
    tmp_path, monkeypatch, env, flags, file, expected
):
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "c.toml"
    config.write_text(file + "\n")
    with pytest.raises(BadInput) as raised:
        load_settings(flags, config)
    message = str(raised.value)
    assert "\n" not in message
    assert expected in message.replace(str(tmp_path) + "/", "")


@pytest.mark.parametrize(
    ("pin", "package", "commit", "day", "applies"),
    [
        ({}, "pypto", "abc", "2026-01-01", True),
        ({"package": "simpler"}, "pypto", "abc", "2026-01-01", False),
        ({"until": "2026-03-01"}, "pypto", "abc", "2026-03-01", True),
        ({"until": "2026-03-01"}, "pypto", "abc", "2026-03-02", False),
        ({"since": "2026-03-01"}, "simpler", "abc", "2026-02-28", False),
        ({"commits": ["abcd"]}, "pypto", "abcdef12", "2020-01-01", True),
        ({"commits": ["abcd"]}, "pypto", "bcdef123", "2020-01-01", False),
        ({"commits": ["abcd"], "until": "2020-01-01"}, "pypto", "ffff", "2019-12-31", True),
    ],
)
def test_a_build_pin_applies_by_package_commit_and_inclusive_date_range(
    pin, package, commit, day, applies
):
    model = BuildPin(requirements=["scikit-build-core==0.12.2"], **pin)
    assert model.applies(package, commit, datetime.date.fromisoformat(day)) is applies


def test_simpler_is_shorthand_for_a_submodule_source_at_the_runtime_path():
    settings = load_settings({"simpler": Path("/s"), "submodule_sources": {"3rdparty/x": "/x"}})
    assert settings.submodule_repos() == {"runtime": (Path("/s"),), "3rdparty/x": (Path("/x"),)}


def test_two_clones_for_the_runtime_are_both_used_rather_than_one_dropped():
    """Upstream with --simpler and a fork with --submodule-source runtime=: pypto may pin
    commits of either, so each clone's objects are searched."""
    same = load_settings({"simpler": Path("/s"), "submodule_sources": {"runtime": "/s/"}})
    assert same.submodule_repos() == {"runtime": (Path("/s"),)}
    both = load_settings({"simpler": Path("/s"), "submodule_sources": {"runtime": "/fork"}})
    assert both.submodule_repos() == {"runtime": (Path("/s"), Path("/fork"))}


@pytest.mark.parametrize(
    ("given", "path"),
    [
        ("./runtime/", "runtime"),
        ("third_party//runtime", "third_party/runtime"),
        ("./third_party/./runtime/", "third_party/runtime"),
    ],
)
def test_a_submodule_path_is_taken_as_git_lists_it(given, path):
    assert load_settings({"submodule_path": given}).submodule_path == path


@pytest.mark.parametrize("given", ["", "/runtime", "third_party/../runtime", "./", "//"])
def test_a_path_outside_the_checkout_is_no_submodule_path(given):
    with pytest.raises(BadInput, match="is not a submodule path inside the checkout"):
        load_settings({"submodule_path": given})


def test_the_runtime_submodule_cannot_be_omitted():
    settings = load_settings({"omit_submodules": ["runtime/"]})
    with pytest.raises(BadInput, match="cannot be left out"):
        settings.submodule_repos()
    assert load_settings({"omit_submodules": ["3rdparty/x"]}).submodule_repos() == {}


def test_new_settings_change_the_run_digest_only_when_set():
    base = load_settings({})
    assert base.run_digest() == load_settings({"wheelhouse": Path("/w")}).run_digest()
    pins = [{"requirements": ["ninja==1.11.1"]}]
    assert base.run_digest() != load_settings({"build_pins": pins}).run_digest()
    assert base.run_digest() != load_settings({"resolve_by_date": False}).run_digest()


def test_the_committed_config_reference_is_the_generated_one():
    committed = Path(__file__).parent.parent / "docs" / "config.md"
    assert committed.read_text() == config_reference(), (
        "docs/config.md is stale: run `bisect-precision-docker config-reference -o docs/config.md`"
    )


def test_the_reference_names_every_setting_its_flag_and_its_variable():
    text = config_reference()
    for name in Settings.model_fields:
        assert f"| `{name}` |" in text
        assert f"`BISECT_PRECISION_{name.upper()}`" in text
        assert f"`{flag_name(name).split('/')[0]}`" in text


def test_a_misspelt_variable_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BISECT_PRECISION_PLATFROM", "a5")
    with pytest.raises(BadInput, match=r"^BISECT_PRECISION_PLATFROM: no such setting"):
        load_settings({})


def test_relative_paths_become_absolute_from_where_the_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(
        {
            "pypto": Path("src/pypto"),
            "workdir": Path("work"),
            "wheelhouse": Path("../wheels"),
            "submodule_sources": {"runtime": Path("clones/simpler")},
        }
    )
    assert settings.pypto == tmp_path / "src" / "pypto"
    assert settings.workdir == tmp_path / "work"
    assert settings.wheelhouse == tmp_path / ".." / "wheels"
    assert settings.submodule_sources == {"runtime": tmp_path / "clones" / "simpler"}


def test_a_bad_value_found_later_is_named_where_the_user_set_it(tmp_path, monkeypatch):
    """Paths are checked when a run starts, not when settings load: the message must still name
    the config file's key or the variable, not a flag the user never typed."""
    config = tmp_path / "bisect-precision.toml"
    config.write_text('pypto = "gone"\nwheelhouse = "nowhere"\n')
    monkeypatch.chdir(tmp_path)

    settings = load_settings({}, config)
    assert settings.given_as("wheelhouse") == f"{config}: wheelhouse"
    assert settings.given_as("script") == "--script"  # never set: named by its flag
    with pytest.raises(BadInput, match=rf"^{re.escape(str(config))}: pypto \S+gone: no such"):
        prepare(settings)

    monkeypatch.setenv("BISECT_PRECISION_PYPTO", str(tmp_path / "elsewhere"))
    with pytest.raises(BadInput, match=r"^BISECT_PRECISION_PYPTO \S+elsewhere: no such"):
        prepare(load_settings({}, config))
    with pytest.raises(BadInput, match=r"^--pypto \S+flagged: no such"):
        prepare(load_settings({"pypto": tmp_path / "flagged"}, config))


def test_the_default_build_command_runs_the_python_that_python_names():
    from runner.workflow import build_settings

    other = build_settings(Settings(python="python3.11"), "sha256:base")
    assert other.command == "python3.11 /tmp/bisect-pep517.py /out"
    assert build_settings(Settings(), "sha256:base").command == DEFAULT_BUILD_COMMAND
    custom = Settings(python="python3.11", build_command="make wheel")
    assert build_settings(custom, "sha256:base").command == "make wheel"


def test_settings_the_chosen_search_ignores_are_warned_about():
    from runner.prepare import _unused_settings

    assert _unused_settings(Settings()) == []
    assert _unused_settings(Settings(repeat=3, policy="any-fail")) == []
    assert _unused_settings(Settings(repeat=3)) == []
    [tie] = _unused_settings(Settings(repeat=2))  # majority by default
    assert tie.startswith("--repeat 2 with the majority policy: a tie (half the runs fail)")
    assert "fixed repeats only" in _unused_settings(Settings(policy="any-fail"))[0]
    assert "not used with --repeat 3" in _unused_settings(Settings(repeat=3, confidence=0.99))[0]
    [ray_device] = _unused_settings(Settings(executor="ray", device="0,1"))
    assert ray_device.startswith("--device is not used with --executor ray")
    assert _unused_settings(Settings(executor="ray")) == []
    [local] = _unused_settings(Settings(ray_address="127.0.0.1:6379"))
    assert local.startswith("--ray-address is not used")


def test_a_table_key_with_a_plain_value_is_refused_even_when_a_flag_gives_the_table(tmp_path):
    config = tmp_path / "bisect-precision.toml"
    config.write_text('run_env = "x"\n')
    for flags in ({}, {"run_env": {"UX_RUN_SECONDS": "5"}}):
        with pytest.raises(BadInput, match=r"run_env: expected a table"):
            load_settings(flags, config)


def test_a_run_env_default_removed_stays_removed_when_the_settings_are_saved_and_read_back():
    """settings.json is what `reproduce` and `export` run with: a removed PTO2_RING_HEAP came
    back from the defaults there, and the reproduction ran in another environment."""
    removed = load_settings({"run_env": {"PTO2_RING_HEAP": "", "EXTRA": "1"}})
    again = Settings.model_validate_json(removed.model_dump_json())

    assert "PTO2_RING_HEAP" not in again.run_env and again.run_env["EXTRA"] == "1"
    assert again.run_env == removed.run_env and again.run_digest() == removed.run_digest()
    plain = load_settings({})
    assert Settings.model_validate_json(plain.model_dump_json()).run_env == plain.run_env


@pytest.mark.parametrize(
    ("line", "variable", "flags", "where"),
    [
        ('timeout = "soon"\n', None, {"timeout": 30.0}, "c.toml: timeout"),
        ("build_jobs = true\n", None, {"build_jobs": 2}, "c.toml: build_jobs"),
        (
            "",
            ("BISECT_PRECISION_INFRA_RETRIES", "0"),
            {"infra_retries": 2},
            "BISECT_PRECISION_INFRA_RETRIES",
        ),
    ],
)
def test_a_wrong_value_a_flag_hides_is_still_an_error_naming_where_it_is(
    line, variable, flags, where, tmp_path, monkeypatch
):
    config = tmp_path / "c.toml"
    config.write_text(line)
    if variable is not None:
        monkeypatch.setenv(*variable)

    with pytest.raises(BadInput, match=f"^{tmp_path / where if '.toml' in where else where}: "):
        load_settings(flags, config)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("ex/run.py", "ex/run.py"),
        ("ex/../ex/run.py", "ex/run.py"),
        ("./ex/run.py", "ex/run.py"),
        ("../lib/ex/run.py", None),
        ("/abs/ex/run.py", None),
    ],
)
def test_the_script_is_a_path_inside_pypto_lib_however_it_is_spelt(tmp_path, script, expected):
    from runner.prepare import _script

    (tmp_path / "ex").mkdir()
    (tmp_path / "ex" / "run.py").write_text("print('[RUN] PASS')\n")
    if expected is None:
        with pytest.raises(BadInput, match="give a path inside --lib"):
            _script(tmp_path, script)
    else:
        assert _script(tmp_path, script) == expected


@pytest.mark.parametrize(
    ("line", "where", "complaint"),
    [
        ('device_map = ["nocolon"]', "device_map", "'nocolon' is not HOST:CONTAINER[:PERMS]"),
        ('[verdict]\ngood = ["(unclosed"]', "verdict.good", "invalid regex '(unclosed'"),
    ],
)
def test_a_bad_value_checked_late_is_still_named_by_the_file_and_key(
    tmp_path, line, where, complaint
):
    config = tmp_path / "c.toml"
    config.write_text(line + "\n")

    with pytest.raises(BadInput) as raised:
        load_settings({}, config)

    assert str(raised.value).startswith(f"{config}: {where}: {complaint}"), str(raised.value)


def test_a_build_pin_flag_hiding_the_files_pins_is_shown_as_written(tmp_path):
    """As the flag's JSON, not as Python objects (`requirements=[...] since=None ...`)."""
    config = tmp_path / "bisect-precision.toml"
    config.write_text(
        '[[build_pins]]\nrequirements = ["scikit-build-core==0.11.6"]\nsince = 2025-01-01\n'
    )
    flag = {"requirements": ["scikit-build-core==0.10.7"], "package": "pypto"}

    settings = load_settings({"build_pins": [flag]}, config)

    assert settings.overrides == [
        '--build-pin {"requirements": ["scikit-build-core==0.10.7"], "package": "pypto"} '
        'overrides build_pins = {"requirements": ["scikit-build-core==0.11.6"], '
        f'"since": "2025-01-01"}} in {config}'
    ]


def test_a_card_number_is_normalised_as_the_host_check_reads_it():
    """`--device 01` checked /dev/davinci1 but told the example `-d 01`: every run failed as a
    device fault (exit 4). The number is the card's, whatever zeros lead it."""
    assert load_settings({"device": "01"}).device == "1"
    assert load_settings({"device": " 00, 2 "}).device == "0,2"


def test_a_cache_on_a_nearly_full_disk_is_warned_about_before_the_first_build(
    tmp_path, monkeypatch
):
    """ccache fails on a full disk without a word: every build compiled from scratch, and the
    report's ccache hit rate counted only the few lookups it could log (trial F: 4 of 43)."""
    import shutil
    from collections import namedtuple

    from runner.prepare import LOW_CACHE_SPACE, _low_on_space

    if shutil.disk_usage(tmp_path).free >= LOW_CACHE_SPACE:  # this machine's own disk
        assert _low_on_space(tmp_path, "--cache-dir") == []
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(30 << 20, 20 << 20, 10 << 20))
    [said] = _low_on_space(tmp_path, "--cache-dir")
    assert said.startswith(f"the disk of the cache ({tmp_path}) has 10 MiB free: ccache")
    assert said.endswith("point --cache-dir at a larger disk")
