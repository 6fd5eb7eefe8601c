"""Plugin trust (issue 35 item 2): a module of an installed distribution is a plugin only when
that distribution declares it under `twinrun.environments`; the standard library never is; the
user's own modules on the path and twinrun's own are. Nothing named is imported or called."""

from __future__ import annotations

import importlib
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from twinrun.rl.environments import (
    EnvironmentPluginError,
    check_plugin_name,
    make_environment,
)


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
        make_environment(name, args)
    line = str(info.value.message)
    assert "\n" not in line and name in line
    assert "standard library" in line or "'twinrun.environments' entry point" in line
    assert not (tmp_path / "ran").exists()
    assert "marker_mod_xyz" not in sys.modules
    top = name.split(":")[0].split(".")[0]
    if top not in before:  # refused before its package was imported
        assert top not in sys.modules


def _fake_distribution(root: Path, declare: bool) -> None:
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
    _fake_distribution(tmp_path, declare)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    name = "fakedist_envs_xyz.envs:make"
    if declare:
        env = make_environment(name, {})
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


def test_twinrun_own_environment_accepted() -> None:
    assert check_plugin_name("twinrun.golden.shaped_env:make", {})[0] == (
        "twinrun.golden.shaped_env"
    )
