"""Where a Python process's wall time goes: imports, and named phases (functions), exclusively.

    python bench/phase_split.py OUT.json SPEC.json -m MODULE ARGS...
    python bench/phase_split.py OUT.json SPEC.json SCRIPT.py ARGS...

SPEC maps a phase name to a list of functions, each "module:qualname" (a module-level function,
or a method/classmethod of a class in that module), e.g. {"model load":
["transformers.modeling_utils:PreTrainedModel.from_pretrained"]}. The target runs in this
process (runpy) with `builtins.__import__` and `importlib.import_module` wrapped, and each listed
function wrapped as soon as its module has been imported. Time is charged to the innermost open
bucket: an import charges "imports" however deep inside a phase it runs; a phase nested in
another charges itself. What no bucket holds (the interpreter's start before this script runs
is not seen at all; the target's own code outside the phases) is "other". OUT gets
{"buckets": {name: seconds}, "wall_s": seconds from this script's start to the target's end,
"calls": {phase: count}}. Used by bench/sft_vs_trl.py; not part of the package.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import json
import runpy
import sys
import time
from typing import Any

T0 = time.perf_counter()
_stack: list[str] = ["other"]
_spent: dict[str, float] = {}
_calls: dict[str, int] = {}
_last = T0


def _switch(to: str | None) -> None:
    """Charge the time since the last switch to the open bucket; open `to` (None: close)."""
    global _last
    now = time.perf_counter()
    _spent[_stack[-1]] = _spent.get(_stack[-1], 0.0) + now - _last
    _last = now
    if to is None:
        _stack.pop()
    else:
        _stack.append(to)


def _bucketed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _calls[name] = _calls.get(name, 0) + 1
        _switch(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _switch(None)

    wrapper.__phase_split__ = True  # type: ignore[attr-defined]
    return wrapper


class _Phases:
    def __init__(self, spec: dict[str, list[str]]) -> None:
        self.todo: dict[str, list[tuple[str, str]]] = {}  # module -> [(qualname, phase)]
        for phase, targets in spec.items():
            for target in targets:
                module, qualname = target.split(":")
                self.todo.setdefault(module, []).append((qualname, phase))

    def patch_ready(self) -> None:
        for module in [m for m in self.todo if m in sys.modules]:
            mod = sys.modules[module]
            left = []
            for qualname, phase in self.todo[module]:
                if not self._patch(mod, qualname, phase):
                    left.append((qualname, phase))
            if left:
                self.todo[module] = left
            else:
                del self.todo[module]

    @staticmethod
    def _patch(mod: Any, qualname: str, phase: str) -> bool:
        *owners, name = qualname.split(".")
        owner = mod
        for part in owners:
            owner = getattr(owner, part, None)
            if owner is None:
                return False  # the module is still running its top level
        raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if raw is None:
            return False
        if isinstance(raw, classmethod):
            setattr(owner, name, classmethod(_bucketed(phase, raw.__func__)))
        elif isinstance(raw, staticmethod):
            setattr(owner, name, staticmethod(_bucketed(phase, raw.__func__)))
        else:
            setattr(owner, name, _bucketed(phase, raw))
        return True


def _install(phases: _Phases) -> None:
    real_import, real_import_module = builtins.__import__, importlib.import_module

    def timed(real: Any) -> Any:
        @functools.wraps(real)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer = _stack[-1] != "imports"
            if outer:
                _switch("imports")
            try:
                return real(*args, **kwargs)
            finally:
                phases.patch_ready()  # before the importer reads any name of the module
                if outer:
                    _switch(None)

        return wrapper

    builtins.__import__ = timed(real_import)
    importlib.import_module = timed(real_import_module)


def _uninstall() -> None:
    """Put the real import functions back (what runs at exit is not timed)."""
    builtins.__import__ = builtins.__import__.__wrapped__  # type: ignore[attr-defined]
    importlib.import_module = importlib.import_module.__wrapped__  # type: ignore[attr-defined]


def main(argv: list[str]) -> None:
    out, spec_path, *target = argv
    with open(spec_path, encoding="utf-8") as f:
        phases = _Phases(json.load(f))
    _install(phases)
    phases.patch_ready()
    code = 0
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = target
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    _uninstall()
    _switch("end")  # charge the last stretch to the bucket open now ("other")
    result = {"buckets": _spent, "wall_s": time.perf_counter() - T0, "calls": _calls}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
