"""A checkpoint's chat template, rendered within bounds before transformers renders it.

A chat template is code from the checkpoint. transformers renders it in jinja's immutable
sandbox (no file access, no attribute escapes) but with no limit on time or size: `{% for %}`
nested to 1e10 iterations hangs, `'x' * 3000000000` allocates gigabytes. `check_render` renders
the template first in `BoundedSandbox` (the same sandbox, options, filters and globals as
transformers', plus bounds):

- output: at most MAX_OUTPUT characters, counted as the template streams them;
- values: `*`, `+` and `**` refuse a result over MAX_OUTPUT characters (or bits), and a call
  with an integer argument over it (`'x'.ljust(3e9)`) is refused before it runs;
- time: TIME_LIMIT seconds, by an interval timer on the main thread (a loop that prints nothing
  is stopped too) and by a deadline every sandboxed operation checks.

A template that breaks a bound, includes another file, or is refused by the sandbox is one
ConfigError line naming the template's source. Once the bounded render passes, transformers'
own render is the one used, so the text and the ids are exactly what transformers gives.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from twinrun.core.errors import ConfigError

MAX_OUTPUT = 4 << 20  # characters: a context window of text many times over
TIME_LIMIT = 10.0  # seconds for one render; a real template takes well under a millisecond


class _Refused(Exception):
    """A bound broken inside the render."""


def _base_environment() -> Any:
    """transformers' compiled-template environment (for its extensions, filters and globals)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template("").environment


@functools.lru_cache(maxsize=1)
def _sandbox_class() -> type:
    """jinja's immutable sandbox with the bounds: a deadline every operation checks, and the
    values and calls that would break MAX_OUTPUT refused before they run."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**"})
        deadline = float("inf")

        def tick(self) -> None:
            if time.monotonic() > self.deadline:
                raise _Refused(f"ran past the time limit of {TIME_LIMIT:g} s")

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            self.tick()
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            self.tick()
            if any(_is_int(a) and abs(a) > MAX_OUTPUT for a in (*args, *kwargs.values())):
                raise _Refused(f"called {getattr(__obj, '__name__', 'a function')} with an "
                               f"integer over {MAX_OUTPUT}")  # fmt: skip
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj: Any, attribute: str) -> Any:
            self.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            self.tick()
            return super().getitem(obj, argument)

    return BoundedSandbox


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse, before it is computed, a `**` of more than MAX_OUTPUT * 8 bits, or a `*` (a
    repeated string or sequence) or `+` (joined strings or lists) of more than MAX_OUTPUT
    characters."""
    if operator == "**" and _is_int(left) and _is_int(right) and right > 0:
        if max(abs(left).bit_length(), 1) * right > MAX_OUTPUT * 8:
            raise _Refused(f"computed a number of more than {MAX_OUTPUT * 8} bits")
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and _is_int(n):
                if len(seq) * n > MAX_OUTPUT:
                    raise _Refused(f"built a value of more than {MAX_OUTPUT} characters")
    elif operator == "+" and isinstance(left, str | list) and isinstance(right, str | list):
        if len(left) + len(right) > MAX_OUTPUT:
            raise _Refused(f"built a value of more than {MAX_OUTPUT} characters")


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    """The template compiled in a BoundedSandbox configured as transformers configures its own."""
    import jinja2

    class NoFiles(jinja2.BaseLoader):
        def get_source(self, environment: Any, template: str) -> Any:
            raise jinja2.TemplateNotFound(template)

    base = _base_environment()
    env = _sandbox_class()(
        loader=NoFiles(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[type(ext) for ext in base.extensions.values()],
    )
    env.filters.update(base.filters)
    env.globals.update(base.globals)
    return env.from_string(template)


class _Timer:
    """SIGALRM after TIME_LIMIT seconds on the main thread (a no-op elsewhere)."""

    def __enter__(self) -> _Timer:
        self.armed = threading.current_thread() is threading.main_thread()
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._expired)
            self.outer = signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
        return self

    @staticmethod
    def _expired(signum: int, frame: Any) -> None:
        raise _Refused(f"ran past the time limit of {TIME_LIMIT:g} s")

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
            if self.outer[0] > 0:  # an outer timer was running: give it back
                signal.setitimer(signal.ITIMER_REAL, *self.outer)


def _chunks(compiled: Any, variables: dict[str, Any]) -> Iterator[str]:
    yield from compiled.generate(**variables)


def check_render(template: str, variables: dict[str, Any], source: str) -> None:
    """Render `template` with `variables` within the bounds; ConfigError naming `source` when a
    bound is broken or the template cannot be rendered."""
    import jinja2

    where = f"the chat template of {source}"
    hint = "fix the chat template, or use --chat-template off"
    try:
        compiled = _compile(template)  # before the timer: it imports transformers the first time
        with _Timer():
            compiled.environment.deadline = time.monotonic() + TIME_LIMIT
            size = 0
            for chunk in _chunks(compiled, variables):
                size += len(chunk)
                if size > MAX_OUTPUT:
                    raise _Refused(f"rendered more than {MAX_OUTPUT} characters")
                compiled.environment.tick()
    except _Refused as exc:
        raise ConfigError(f"{where} {exc}", hint) from None
    except jinja2.TemplateNotFound as exc:
        raise ConfigError(f"{where} includes another template ({exc.name})", hint) from None
    except jinja2.exceptions.SecurityError as exc:
        raise ConfigError(f"{where} was refused by the sandbox ({_first(exc)})", hint) from None
    except jinja2.TemplateError as exc:
        raise ConfigError(f"{where} cannot be rendered ({_first(exc)})", hint) from None
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise ConfigError(f"{where} cannot be rendered ({type(exc).__name__})", hint) from None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
