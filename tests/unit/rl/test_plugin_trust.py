"""Plugin trust: a module of an installed distribution is a plugin only when a distribution
installed in the site folders declares it under `twinrun.environments` (a forged `.dist-info` in
the current directory declares nothing); the standard library never is; the user's own modules on
the path are; of twinrun's own modules only its declared factories are (no module is trusted as a
whole). Nothing named is imported or called."""

from __future__ import annotations

import importlib
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from twinrun.rl.env_protocol import EnvironmentPluginError
from twinrun.rl.environments import open_environment
from twinrun.rl.plugin_trust import check_plugin_name


class _Marker:
    """Unpickling this touches the marker file (what `numpy:load`/`torch:load` would do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def _cases(tmp_path: Path) -> list[tuple[str, dict[str, object]]]:
    marker = str(tmp_path / "ran")
    payload = tmp_path / "evil.pkl"
    payload.write_bytes(pickle.dumps(_Marker(marker)))
    (tmp_path / "marker_mod_xyz.py").write_text(f"open({marker!r}, 'w').close()\n")
    return [
        ("numpy:load", {"file": str(payload), "allow_pickle": True}),
        ("torch:load", {"f": str(payload), "weights_only": False}),
        ("torch.serialization:load", {"f": str(payload), "weights_only": False}),
        ("pickle:loads", {"data": payload.read_bytes().decode("latin-1")}),
        ("marshal:loads", {"bytes": "x"}),
        ("subprocess:run", {"args": ["touch", marker]}),
        ("importlib:import_module", {"name": "marker_mod_xyz"}),
        ("builtins:exec", {"source": f"open({marker!r}, 'w').close()"}),
    ]


NAMES = [
    "numpy:load",
    "torch:load",
    "torch.serialization:load",
    "pickle:loads",
    "marshal:loads",
    "subprocess:run",
    "importlib:import_module",
    "builtins:exec",
]


@pytest.mark.parametrize("name", NAMES)
def test_untrusted_plugin_refused_and_nothing_runs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    args = dict(_cases(tmp_path))[name]
    before = set(sys.modules)
    with pytest.raises(EnvironmentPluginError) as info:
        open_environment(name, args)
    line = str(info.value.message)
    assert "\n" not in line and name in line
    assert "standard library" in line or "'twinrun.environments' entry point" in line
    assert not (tmp_path / "ran").exists()
    assert "marker_mod_xyz" not in sys.modules
    top = name.split(":")[0].split(".")[0]
    if top not in before:  # refused before its package was imported
        assert top not in sys.modules


def _fake_distribution(root: Path, declare: bool) -> None:
    root.mkdir(parents=True, exist_ok=True)
    pkg = root / "fakedist_envs_xyz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(
        textwrap.dedent(
            """
            class Env:
                def prompt(self, row, rng):
                    return "p"

                def reward(self, row, completion):
                    return 1.0

            def make():
                return Env()
            """
        )
    )
    info = root / "fakedist_envs_xyz-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist-envs-xyz\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("fakedist_envs_xyz\n")
    if declare:
        (info / "entry_points.txt").write_text(
            "[twinrun.environments]\nmine = fakedist_envs_xyz.envs:make\n"
        )


@pytest.fixture
def fresh_import(monkeypatch: pytest.MonkeyPatch):
    yield
    for mod in [m for m in sys.modules if m.startswith("fakedist_envs_xyz")]:
        del sys.modules[mod]
    importlib.invalidate_caches()


@pytest.mark.parametrize("declare", [True, False])
def test_installed_distribution_needs_entry_point(
    declare: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_import: None
) -> None:
    site = tmp_path / "lib" / "site-packages"  # an absolute site folder on the path
    _fake_distribution(site, declare)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    name = "fakedist_envs_xyz.envs:make"
    if declare:
        env = open_environment(name, {})
        assert env.prompt({}, None) == "p"
    else:
        with pytest.raises(EnvironmentPluginError, match="fakedist-envs-xyz.*entry point"):
            check_plugin_name(name, {})
        assert "fakedist_envs_xyz" not in sys.modules


def test_user_module_on_path_still_a_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_own_envs_xyz.py").write_text("def make():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert check_plugin_name("my_own_envs_xyz:make", {}) == ("my_own_envs_xyz", "make")


def test_a_declared_twinrun_factory_is_accepted() -> None:
    assert check_plugin_name("twinrun.golden.shaped_env:make", {})[0] == (
        "twinrun.golden.shaped_env"
    )


def _twinrun_writers(tmp_path: Path) -> list[tuple[str, dict[str, object]]]:
    """twinrun's own functions that write, delete or run, each with arguments that would leave
    (or remove) a marker file."""
    marker = str(tmp_path / "ran")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    return [
        ("twinrun.core.fileio:atomic_write_text", {"path": marker, "text": "import os"}),
        ("twinrun.core.fileio:atomic_write_bytes", {"path": marker, "data": "x"}),
        ("twinrun.core.fileio:atomic_write_json", {"path": marker, "obj": {}}),
        ("twinrun.core.fileio:atomic_write_jsonl", {"path": marker, "rows": []}),
        ("twinrun.core.owned:remove", {"entries": [str(victim)]}),
        ("twinrun.harness:execute", {"run": ["touch", marker], "log_dir": str(tmp_path)}),
        ("twinrun.golden.shaped_env:Shaped", {}),  # a declared module, an undeclared factory
        ("twinrun.cli.main:run_cli", {"argv": ["toy-model", marker, "--seed", "0"]}),
    ]


@pytest.mark.parametrize("index", range(8))
def test_no_twinrun_function_is_a_plugin(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    name, args = _twinrun_writers(tmp_path)[index]
    makers = (  # as a single-turn run opens it, and as a tool run does (with its limits)
        lambda: open_environment(name, args),
        lambda: open_environment(name, args, max_turns=2, timeout_s=5.0),
    )
    for make in makers:
        with pytest.raises(EnvironmentPluginError) as info:
            make()
        line = str(info.value)
        assert "\n" not in line and name in line and "twinrun's own modules" in line
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "victim.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]


def test_a_forged_dist_info_in_the_current_directory_declares_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m twinrun` puts the current directory on the path: a `.dist-info` there that
    claims to be numpy and declares `numpy:load` an environment is not an installed
    distribution, and the pickle never loads."""
    marker = tmp_path / "ran"
    payload = tmp_path / "evil.pkl"
    payload.write_bytes(pickle.dumps(_Marker(str(marker))))
    info = tmp_path / "numpy-99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 99.0\n")
    (info / "top_level.txt").write_text("numpy\n")
    (info / "entry_points.txt").write_text("[twinrun.environments]\nload = numpy:load\n")
    monkeypatch.chdir(tmp_path)
    for entry in (str(tmp_path), ""):  # the absolute form `python -m` uses, and the relative
        monkeypatch.setattr(sys, "path", [entry, *sys.path])
        importlib.invalidate_caches()
        from importlib import metadata

        assert any(
            ep.value == "numpy:load" for ep in metadata.entry_points(group="twinrun.environments")
        )  # fmt: skip  (the forged entry point is visible: the rule, not luck, refuses it)
        with pytest.raises(EnvironmentPluginError, match="entry point"):
            open_environment("numpy:load", {"file": str(payload), "allow_pickle": True})
        assert not marker.exists()
