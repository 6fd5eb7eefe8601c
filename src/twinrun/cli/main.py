"""Entry point: a click group whose commands are imported only when called, so `twinrun --help`
answers without importing torch. Known errors print one line and exit non-zero; a traceback only
with TWINRUN_DEBUG=1. Every line printed here goes through redaction first: an error never shows
URL userinfo or a secret-named query value, whatever raised it."""

from __future__ import annotations

import errno
import gc
import importlib
import os
import signal
import sys
import warnings
from typing import Any

import click

# command name -> (module, attribute, one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "toy-model": ("twinrun.cli.toy_model", "toy_model", "Write a tiny Llama checkpoint."),
    "tune": ("twinrun.cli.tune", "tune", "Train a LoRA adapter, or evaluate one."),
    "generate": ("twinrun.cli.generate", "generate", "Generate text (greedy or seeded)."),
    "extract": ("twinrun.cli.extract", "extract", "Hidden states and steering vectors."),
    "diff": ("twinrun.cli.diff", "diff", "First divergence between two runs."),
    "check": ("twinrun.cli.check", "check", "Determinism harness: run a command three times."),
    "demo": ("twinrun.cli.demo", "demo", "The guided tour on the toy model."),
    "run": ("twinrun.cli.run", "run", "Run a TOML config (any trainer, or a replay)."),
    "init": ("twinrun.cli.init_config", "init_config", "Write a TOML config to edit and run."),
    "explain": ("twinrun.cli.explain", "explain", "Check a replay config; no model built."),
    "evidence": ("twinrun.cli.evidence", "evidence", "Evidence gates for a capture's replays."),
    "init-adapter": ("twinrun.cli.init_adapter", "init_adapter", "Write an initial adapter."),
    "golden": ("twinrun.cli.golden", "golden", "Golden artifacts: write or check a platform's."),
    "reproduce": ("twinrun.cli.reproduce", "reproduce", "Re-run a recorded run; same bytes?"),
    "export": ("twinrun.cli.export", "export", "Merge a run's adapter into its base model."),
    "plot": ("twinrun.cli.plot", "plot", "Loss, lr, grad-norm and reward curves as a PNG."),
    "launch": ("twinrun.cli.launch", "launch", "torchrun, a refusal read as one line."),
}


# first words of another tool's training command: answered with `twinrun tune`
TRAINING_WORDS = ("train", "finetune", "fine-tune", "fit")

SIGINT_SEEN: list[bool] = []  # set by the handler `main` installs: a Ctrl-C has arrived
INTERRUPTED_LINE = (
    "twinrun: interrupted (SIGINT) — the command did not finish; rerun it (with --overwrite "
    "where it had begun its output)"
)


class StartInterrupted(Exception):
    """Ctrl-C outside a run's steps (while starting, loading or writing): one line, exit 130."""


def _note_sigint(signum: int, frame: Any) -> None:
    from twinrun.core import interrupts

    if interrupts.ending():  # a signal ended the run's steps: it says so; this changes nothing
        return
    SIGINT_SEEN.append(True)
    interrupts.note()  # for the writers' last check: a library may swallow what is raised
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt, as Python's own


def _quiet_swallowed_interrupt(hook: Any) -> Any:
    """`sys.unraisablehook` that prints nothing for a noted Ctrl-C raised where Python cannot
    propagate it (a library's `__del__`): the command stops at its writer's next check and
    says so in one line. Anything else goes to `hook`."""

    def unraisable(info: Any) -> None:
        from twinrun.core import interrupts

        if isinstance(info.exc_value, KeyboardInterrupt) and interrupts.SEEN:
            return
        hook(info)

    return unraisable


def interrupted() -> int:
    click.echo(INTERRUPTED_LINE, err=True)
    return 130


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, but an objective named where a command belongs (`twinrun sft`, `twinrun
        train sft`) is answered with the command that trains it: `twinrun tune sft`."""
        from twinrun.objectives.registry import OBJECTIVES

        if args and args[0] not in COMMANDS:
            names = [o.name for o in OBJECTIVES]
            named = [a for a in args[:2] if a in names]
            if named or args[0] in TRAINING_WORDS:
                command = (
                    f"`twinrun tune {named[0]}`"
                    if named
                    else f"`twinrun tune OBJECTIVE` ({', '.join(names)})"
                )
                raise click.UsageError(f"no such command; training is {command}", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # before click turns it into a blank line and "Aborted"
            raise StartInterrupted() from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`--version`: twinrun's, then the Python, libraries and platform its runs record (read
    from package metadata: nothing is imported)."""
    if not value or ctx.resilient_parsing:
        return
    from twinrun.core.determinism import runtime_versions

    versions = runtime_versions()
    click.echo(f"twinrun {versions.pop('twinrun', None) or 'unknown'}")
    platform_name = versions.pop("platform", None)
    click.echo(", ".join(f"{name} {v or 'not installed'}" for name, v in versions.items()))
    click.echo(f"platform {platform_name}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version", is_flag=True, expose_value=False, is_eager=True, callback=print_versions,
    help="Show twinrun's version and the library versions its runs record, and exit.",
)  # fmt: skip
def cli() -> None:
    """twinrun: reproducible LLM post-training.

    Every run is an artifact: same command, seed, checkpoint and locked environment write the
    same adapter bytes. Start with `twinrun demo`.
    """


def debug_enabled() -> bool:
    return os.environ.get("TWINRUN_DEBUG", "") not in ("", "0")


def say(line: str) -> None:
    """Print one error line to stderr, redacted, on one line. Under `twinrun launch` a process
    other than its node's local rank 0 hands the line to the launcher instead, which prints the
    first failed process's line when local rank 0 printed none (`train.launcher`)."""
    from twinrun.core.redact import redact_string
    from twinrun.train.parallel.launcher import hand_over

    one = " ".join(part.strip() for part in redact_string(line).splitlines() if part.strip())
    if not hand_over(one):
        click.echo(one, err=True)


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning a command raises, as one redacted line (not Python's two: where, and the
    source line). Under torchrun rank 0 says it: every process computes the same steps."""
    if os.environ.get("RANK", "0") != "0":
        return
    say(f"twinrun: warning: {message} ({category.__name__})")


MEMORY_LINE = (
    "twinrun: error: out of memory ({what}) — free memory, or raise this process's memory limit "
    "(ulimit -v), and rerun"
)


def memory_line(exc: BaseException) -> str | None:
    """The one line for a memory limit met anywhere, or None for any other failure."""
    from twinrun.core.errors import memory_failure

    what = memory_failure(exc)
    return None if what is None else MEMORY_LINE.format(what=what)


def os_error_line(exc: OSError) -> str:
    """An OS error that escaped a command: what failed, on which path."""
    where = exc.filename if exc.filename is not None else "an output or input path"
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some space and rerun"
    elif exc.errno == errno.EROFS:
        hint = "the file system is read-only: write to a writable one"
    else:
        hint = "check that the path exists, is the right kind and is readable/writable"
    return f"twinrun: error: {where}: {reason} — {hint}"


def run_cli(args: list[str] | None = None) -> int:
    """Run the CLI and return the exit code (used by tests in-process and by `main`)."""
    from twinrun.core import (
        interrupts,
        redact,  # noqa: F401  # imported now: `say` needs no memory later
    )
    from twinrun.core.errors import ConfigError, TwinrunError
    from twinrun.train.parallel import launcher  # noqa: F401  # (and this, which `say` asks first)

    interrupts.ENDING.clear()  # a command starts with no run ended (in-process, one of many)
    try:
        nul = next((i for i, a in enumerate(args or []) if "\0" in a), None)
        if nul is not None:  # only in-process: an OS command line cannot hold one
            raise ConfigError(f"argument {nul + 1} contains a NUL byte", "remove it")
        hook, sys.unraisablehook = (
            sys.unraisablehook,
            _quiet_swallowed_interrupt(sys.unraisablehook),
        )
        try:
            with warnings.catch_warnings():
                warnings.showwarning = show_warning
                rv = cli.main(args=args, prog_name="twinrun", standalone_mode=False)
        finally:
            sys.unraisablehook = hook
    except StartInterrupted:
        return interrupted()
    except TwinrunError as exc:
        if debug_enabled():
            raise
        if SIGINT_SEEN and exc.exit_code != 130:  # e.g. a load a Ctrl-C broke, not the input
            return interrupted()
        say(f"twinrun: error: {exc.one_line()}")
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        from twinrun.cli.usage import usage_line

        where = exc.ctx.command_path if exc.ctx is not None else "twinrun"
        say(f"twinrun: error: {usage_line(exc)} — see '{where} --help'")  # no value echoed
        return exc.exit_code
    except click.ClickException as exc:
        say(f"twinrun: error: {exc.format_message()}")
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        return interrupted()
    except OSError as exc:  # the environment, not a bug: a full disk, a path that vanished
        if debug_enabled():
            raise
        if SIGINT_SEEN:
            return interrupted()
        say(memory_line(exc) or os_error_line(exc))
        return 2
    except Exception as exc:  # a bug, not a user error: still one line unless debugging
        if debug_enabled():
            raise
        if SIGINT_SEEN:  # an import or a load a Ctrl-C cut short (ImportError and the like)
            return interrupted()
        memory = memory_line(exc)  # the environment too: a memory limit, not a bug
        if memory is not None:
            say(memory)
            return 2
        from twinrun.core.safetensors_io import disk_error

        disk = disk_error(exc, "an output path")  # e.g. safetensors' own "No space left"
        if disk is not None and not isinstance(exc, OSError):
            say(os_error_line(disk))
            return 2
        say(
            f"twinrun: internal error: {type(exc).__name__}: {exc} — "
            "rerun with TWINRUN_DEBUG=1 for the traceback and report it"
        )
        return 1
    # commands return their exit code (or None for success); click returns Exit codes likewise
    return rv if isinstance(rv, int) else 0


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when ignored
        signal.signal(signal.SIGINT, _note_sigint)
    try:
        from twinrun.core.portable import pin_environment

        pin_environment()  # before anything imports torch: kernels are chosen at first use
        code = run_cli()
    except KeyboardInterrupt:
        code = interrupted()
    from twinrun.core import interrupts

    if interrupts.ending():  # on its way out after a signal: one more prints nothing (an atexit
        for sig in (signal.SIGINT, signal.SIGTERM):  # hook's traceback) nor ends it otherwise
            signal.signal(sig, signal.SIG_IGN)
    if code == 0:  # under torchrun: leave the process group (a failed run just exits)
        from twinrun.train.parallel.distributed import teardown

        teardown()
    # The process ends here: without this the interpreter's last garbage collections walk every
    # object the imports of torch and transformers made, about 2 s of a toy run's 10
    gc.freeze()
    sys.exit(code)
