"""Which code may run as a GRPO environment plugin, and loading it (docs/training.md).

`--env module.path:factory` imports the module and calls `factory(**args)`. A plugin is code
that runs with the user's rights, so it runs only where the user named it, and only code of the
user's own choosing runs. The rule, checked in this order:

1. the module is not in the standard library (`sys.stdlib_module_names`, e.g. `os`, `subprocess`,
   `builtins`) — refused before anything is imported, so `os:system` never runs;
2. the module resolves (`plugin_spec`: found by the import system's finders without executing
   any module; all `twinrun explain` checks, it never imports a plugin) and is trusted
   (`check_plugin_trust`, from the top-level package's spec and installed metadata, before any
   import): the user's own modules on the path are plugins; of twinrun's own modules only the
   factories it declares (`DECLARED_FACTORIES`) are — no module is trusted as a whole, so
   `twinrun.core.fileio:atomic_write_text` is refused; a built-in/frozen module or one under the
   standard library's directory is refused; a module of an installed distribution
   (`importlib.metadata.packages_distributions()` of its top-level package, or found under
   site-packages/dist-packages) is a plugin only when a distribution installed in the
   environment's site folders declares it under the `twinrun.environments` entry point group
   (`module:factory` or `module`), so `numpy:load` and `torch.serialization:load` are refused,
   and a forged `.dist-info` in the current directory or a relative `sys.path` entry declares
   nothing. The submodule of a package is
   located one level at a time with the finders, never by `importlib.util.find_spec` (which would
   import, and run, the parent package);
3. (`twinrun run` / `tune grpo` only: `load_plugin_factory`) the module is imported, and
   `factory` must be a Python function or class *defined in that module* (`factory.__module__`
   is the module): a builtin or C function, a partial, or a callable imported from elsewhere
   (`from os import system`) is refused before it is called with any user argument;
4. what `factory(**args)` makes has one of the environment shapes (`environments.py`).

Every way a plugin can fail is an `EnvironmentPluginError` (a `ConfigError`) whose one line
names the plugin. Argument values are never echoed (they may hold secrets): an exception's text
has every argument value replaced by `<redacted>`. This module does not import torch.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from twinrun.rl.builtin_envs import BUILTIN_ENVIRONMENTS
from twinrun.rl.env_checks import argument_strings, one_line
from twinrun.rl.env_protocol import EnvironmentPluginError
from twinrun.rl.tool_envs import TOOL_ENVIRONMENTS

PLUGIN_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def check_plugin_name(name: str, args: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """Rules 1 and 2 for a plugin `module.path:factory`: the form, the argument names, not the
    standard library, and the module resolves — without importing or running anything. Returns
    (module, factory)."""
    if not PLUGIN_NAME.match(name):
        raise EnvironmentPluginError(
            f"environment plugin {name!r} is not of the form module.path:factory",
            "e.g. --env mypkg.envs:make_env",
        )
    bad_keys = [k for k in args or {} if not isinstance(k, str) or not k.isidentifier()]
    if bad_keys:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: argument names must be identifiers, got {bad_keys}"
        )
    module_name, factory_name = name.split(":")
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {top!r} is part of Python's standard library, not an "
            "environment plugin (a plugin is code that runs with your rights)",
            "name a factory defined in your own module, e.g. --env mypkg.envs:make_env",
        )
    top_spec = plugin_spec(top)
    if top_spec is None or plugin_spec(module_name) is None:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: cannot find module {module_name!r}",
            "check that the module is importable (installed or on PYTHONPATH)",
        )
    check_plugin_trust(name, module_name, factory_name, top_spec)
    return module_name, factory_name


ENTRY_POINT_GROUP = "twinrun.environments"
# twinrun's own factories that are environments (the golden suite's); every other function of a
# twinrun module is refused as a plugin, however harmless its module looks
DECLARED_FACTORIES = frozenset({"twinrun.golden.shaped_env:make"})


def _under(path: str, roots: set[str]) -> bool:
    import os

    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots if r)


def _installed_roots() -> tuple[set[str], set[str]]:
    """(the standard library's directories, the directories installed packages live in)."""
    import os
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    installed = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    try:
        installed |= {os.path.realpath(p) for p in site.getsitepackages()}
    except AttributeError:  # a virtualenv's old site module
        pass
    installed |= {
        os.path.realpath(p)
        for p in sys.path
        if p
        and os.path.isabs(p)
        and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")
    }
    return stdlib, installed


def _installed_entry_points(installed: set[str]) -> list[Any]:
    """The `twinrun.environments` entry points of distributions installed in the environment's
    site folders: a distribution found in the current directory, a relative `sys.path` entry or
    anywhere else on the path declares nothing (a forged `.dist-info` beside the user's files
    would otherwise name `numpy:load` a plugin)."""
    import os
    from importlib import metadata

    cwd = os.path.realpath(os.getcwd())
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if dist is None:
            continue
        try:
            where = os.path.realpath(str(dist.locate_file("")))
        except Exception:  # a distribution of another kind, with no location
            continue
        if where != cwd and _under(where, installed):
            found.append(ep)
    return found


def check_plugin_trust(
    name: str, module_name: str, factory_name: str, top_spec: importlib.machinery.ModuleSpec
) -> None:
    """Rule 1b, checked from the top-level package's spec and the installed metadata, before
    any module is imported: a plugin is twinrun's own, or the user's own module on the path, or a
    module an installed distribution declares under the `twinrun.environments` entry point
    group. Refused: a built-in or frozen module, a module under the standard library's directory,
    and a module of an installed distribution (`importlib.metadata.packages_distributions()` of
    its top-level package, or a module under site-packages/dist-packages) that has no such entry
    point naming it (`numpy:load`, `torch.serialization:load`)."""
    from importlib import metadata

    top = module_name.split(".")[0]
    if top == "twinrun":
        if f"{module_name}:{factory_name}" in DECLARED_FACTORIES:
            return
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: twinrun's own modules are not plugins (only the "
            "environments it declares are, by name)",
            f"name a built-in environment ({', '.join(BUILTIN_ENVIRONMENTS + TOOL_ENVIRONMENTS)})"
            " or a factory defined in your own module",
        )
    origin = top_spec.origin or ""
    locations = list(top_spec.submodule_search_locations or ())
    where = [origin] if origin and origin not in ("built-in", "frozen") else []
    where += locations
    stdlib, installed = _installed_roots()
    if origin in ("built-in", "frozen") or (
        where and all(_under(p, stdlib) and not _under(p, installed) for p in where)
    ):
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {top!r} is part of Python's standard library, not an "
            "environment plugin (a plugin is code that runs with your rights)",
            "name a factory defined in your own module, e.g. --env mypkg.envs:make_env",
        )
    try:
        dists = sorted(set(metadata.packages_distributions().get(top, ())))
    except Exception:  # broken metadata of some other distribution
        dists = []
    if not dists and not any(_under(p, installed) for p in where):
        return  # the user's own module on the path
    for ep in _installed_entry_points(installed):
        dist_name = ep.dist.name if ep.dist is not None else None
        if dists and dist_name not in dists:
            continue
        if ep.module == module_name and ep.attr in (None, factory_name):
            return
    owner = f"distribution {', '.join(dists)!s}" if dists else "an installed package"
    raise EnvironmentPluginError(
        f"environment plugin {name!r}: module {module_name!r} belongs to {owner}, which does "
        f"not declare it under the {ENTRY_POINT_GROUP!r} entry point group",
        f"an installed package is a plugin only when it declares [project.entry-points."
        f'"{ENTRY_POINT_GROUP}"] naming {module_name}:{factory_name}; or put your own module '
        "on PYTHONPATH",
    )


def plugin_spec(module_name: str) -> importlib.machinery.ModuleSpec | None:
    """Where `module_name` would be imported from, or None — found by `sys.meta_path`'s finders
    one package level at a time, so no package's `__init__` runs (importlib.util.find_spec would
    import the parent packages of a dotted name)."""
    spec: importlib.machinery.ModuleSpec | None = None
    path: Any = None
    parts = module_name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        loaded = sys.modules.get(full)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(full, path) if find is not None else None
                if spec is not None:
                    break
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None  # a module, not a package: it has no submodules
    return spec


def _check_factory(name: str, module_name: str, factory_name: str, factory: Any) -> None:
    """Rule 3: a Python function or class defined in the named module."""
    if not callable(factory):
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {factory_name!r} is a {type(factory).__name__}, "
            "not callable"
        )
    if not (inspect.isfunction(factory) or inspect.isclass(factory)):
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {factory_name!r} is a {type(factory).__name__}, not "
            "a Python function or class",
            "define a factory function or class in the plugin module",
        )
    if getattr(factory, "__module__", None) != module_name:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {factory_name!r} is defined in "
            f"{getattr(factory, '__module__', None)!r}, not in {module_name!r}",
            "name a factory defined in the plugin module itself, not one it imports",
        )


def load_plugin_factory(
    name: str, args: Mapping[str, Any] | None
) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """Rules 1 to 3 for a plugin `module.path:factory`: the module is imported and the factory
    found and checked, never called. Returns (factory, the texts of the argument values to hide
    in every error line). Every failure is an EnvironmentPluginError naming the plugin."""
    module_name, factory_name = check_plugin_name(name, args)
    hide = tuple(t for v in (args or {}).values() for t in argument_strings(v))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import can fail in any way the module's code can
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: cannot import module {module_name!r}: "
            f"{type(exc).__name__}: {one_line(exc, hide)}",
            "check that the module is importable (installed or on PYTHONPATH)",
        ) from exc
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: module {module_name!r} has no attribute "
            f"{factory_name!r}",
            "name a factory function or class defined in that module",
        )
    _check_factory(name, module_name, factory_name, factory)
    return factory, hide
