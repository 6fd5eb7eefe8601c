"""The portable mode's pin of ATen's capability, and the environment a child process gets.

`pin_environment` puts `ATEN_CPU_CAPABILITY=avx2` in the environment (unless the user set it)
before torch is imported; `unpin_environment` takes it back for a native run; `user_environment`
is the environment the user's command had, which every process twinrun starts receives (a
twinrun child, and the C compiler of the digit kernels). Imports nothing of twinrun.
"""

from __future__ import annotations

import os

PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2"}
_pinned_here: dict[str, str] = {}  # what pin_environment set (so `native` can take it back)


def pin_environment() -> None:
    """Put the portable mode's variables in the environment unless the user set them. Imports
    nothing; call it before torch is imported (the CLI does at start-up, tests in conftest)."""
    for name, value in PINNED_ENV.items():
        if name not in os.environ:
            os.environ[name] = value
            _pinned_here[name] = value


def unpin_environment() -> None:
    """Take back what `pin_environment` set (for a `native` run, before torch's first kernel)."""
    for name, value in list(_pinned_here.items()):
        if os.environ.get(name) == value:
            del os.environ[name]
        del _pinned_here[name]


def user_environment() -> dict[str, str]:
    """The environment the user's command had: this process's, less what `pin_environment` set
    here. Every twinrun child is started with it (`check`'s runs, `evidence --repeat`'s
    replays): a native child then runs the machine's own kernels as the same command run
    directly does, a portable one pins them itself at its start-up, and a value the user set
    passes through. A pin inherited as if the user had set it would hold a native child to the
    portable mode's AVX2 kernels."""
    env = dict(os.environ)
    for name, value in _pinned_here.items():
        if env.get(name) == value:
            del env[name]
    return env
