"""Settings: flags win over the environment, which wins over the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.config import load_settings
from runner.errors import BadInput


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
