"""The modules one toy SFT run's set-up passes through, from `train` to its first step.

A profile hook (`sys.setprofile`) sees every Python call from the moment `train(run)` is entered
until the loop's first `run_step`; each call made by a twinrun module's code into another twinrun
module's is a transition. Reported: the modules in the order first entered, the transitions, the
re-entries (an entry into a module that was entered before and left since), and the entries per
module; and, for every call, the same per stage of the set-up (each call `train` makes, with all
it calls): which stage the re-entries come from, and whether a stage's come from a loop (one
module pair entered again for each setting, row or layer). Calls into torch, transformers and
the standard library are not counted: a module's call out to them and back is no transition.

What it shows is structure, not speed: fewer re-entries is a set-up that reads in one pass.
Writes bench/results/setup_trace.json and .md (`--quick` is the same run: it takes seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from benchkit import meta, write_results  # noqa: E402

sys.path.insert(0, str(benchkit.ROOT))

NAME = "setup_trace"


class FirstStep(Exception):
    """Raised by the hook when the loop starts its first step: the trace ends there."""


def trace_setup(work: Path) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """The twinrun module of every call, in order, from `train` to the first step; of every
    call that takes the run's configuration (a `RunConfig` or `ValidRun` argument); and every
    call's (stage, module), a stage being the call `train` made that it is part of."""
    import os

    from testkit.toy_runs import write_examples
    from twinrun.config.resolved import ValidRun
    from twinrun.config.run import RunConfig
    from twinrun.model.toy import write_toy_checkpoint
    from twinrun.train.recipes import train
    from twinrun.train.step import loop as loop_module

    model = work / "model"
    write_toy_checkpoint(model, seed=0)
    examples = write_examples(work / "data")["sft"]
    run = RunConfig(
        objective="sft", model=str(model), examples=str(examples), output=str(work / "out"),
        seed=0, batch_size=2, learning_rate=1e-2, warmup_steps=0, lr_schedule="cosine",
        lora_rank=4, lora_alpha=8.0, precision="f32", quiet=True, cpu_kernels="native",
        threads=1, epochs=1, accumulation=1, chat_template="on",
    )  # fmt: skip
    calls: list[str] = []
    taking_run: list[str] = []
    staged: list[tuple[str, str]] = []
    first_step = loop_module.Loop.run_step.__code__
    train_code = train.__code__
    train_frame: list[Any] = []  # the frame of `train`, once entered
    stage = [""]

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        if frame.f_code is first_step:
            sys.setprofile(None)
            raise FirstStep
        if frame.f_code is train_code:
            train_frame.append(frame)
        elif train_frame and frame.f_back is train_frame[0]:
            stage[0] = frame.f_code.co_qualname
        name = frame.f_globals.get("__name__", "")
        if name.startswith("twinrun."):
            calls.append(name)
            if train_frame and frame.f_code is not train_code:
                staged.append((stage[0], name))
            code = frame.f_code
            names = code.co_varnames[: code.co_argcount]
            # the run's own methods (the run as `self`) are the run, not a module it passes through
            args = [frame.f_locals.get(a) for a in names if a not in ("self", "cls")]
            if any(isinstance(a, (RunConfig, ValidRun)) for a in args):
                taking_run.append(name)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.setprofile(hook)
    try:
        train(run)
    except FirstStep:
        pass
    finally:
        sys.setprofile(None)
    return calls, taking_run, staged


def summarise(calls: list[str]) -> dict[str, Any]:
    """Modules in first-entry order, transitions, re-entries and entries per module."""
    path = [m for i, m in enumerate(calls) if i == 0 or calls[i - 1] != m]
    seen: set[str] = set()
    order: list[str] = []
    reentries = 0
    for module in path:
        if module in seen:
            reentries += 1
        else:
            seen.add(module)
            order.append(module)
    entries = Counter(path)
    return {
        "path": path,
        "modules": order,
        "transitions": len(path) - 1,
        "reentries": reentries,
        "entries": dict(entries.most_common()),
    }


def by_stage(staged: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every call's re-entries, per stage of the set-up, in the order the stages ran; with the
    module most entered in the stage and the stage's distinct module-to-module transitions
    (a loop that enters one module pair again per item adds re-entries, not distinct ones)."""
    stages: dict[str, list[str]] = {}
    for name, module in staged:
        stages.setdefault(name, []).append(module)
    rows = []
    for name, modules in stages.items():
        s = summarise(modules)
        top, n = next(iter(s["entries"].items()))
        pairs = {(a, b) for a, b in zip(s["path"], s["path"][1:], strict=False)}
        rows.append({
            "stage": name, "modules": len(s["modules"]), "reentries": s["reentries"],
            "distinct_transitions": len(pairs), "most_entered": top, "entries": n,
        })  # fmt: skip
    return rows


def stage_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "**Every twinrun call, by stage** (each call `train` makes, with all it calls):",
        "",
        "| stage | modules | re-entries | distinct transitions | most entered |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['stage']}` | {r['modules']} | {r['reentries']} | "
            f"{r['distinct_transitions']} | `{r['most_entered'].removeprefix('twinrun.')}` "
            f"{r['entries']} |"
        )
    total = sum(r["reentries"] for r in rows)
    lines += ["", f"Re-entries inside the stages: {total} (the rest are between stages).", ""]
    return lines


def section(title: str, s: dict[str, Any]) -> list[str]:
    top = ", ".join(
        f"`{m.removeprefix('twinrun.')}` {n}" for m, n in list(s["entries"].items())[:8]
    )
    order = " → ".join(f"`{m.removeprefix('twinrun.')}`" for m in s["modules"])
    return [
        f"**{title}**: {len(s['modules'])} modules, {s['transitions']} transitions, "
        f"{s['reentries']} re-entries. Most entered: {top}.",
        "",
        f"In order of first entry: {order}",
        "",
    ]


def render(res: dict[str, Any]) -> str:
    lines = [
        f"Measured {res['meta']['when']} by `python -m bench setup_trace`, commit "
        f"{res['meta']['git_commit']}: one toy SFT run, from `train(run)` to its first step.",
        "",
        *section("Calls that take the run's configuration", res["taking_run"]),
        *section("Every twinrun call", res["all_calls"]),
        *stage_table(res["by_stage"]),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the same run: it takes seconds")
    ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="twinrun-setup-trace-") as tmp:
        calls, taking_run, staged = trace_setup(Path(tmp))
    res = {
        "meta": meta(0.0),
        "taking_run": summarise(taking_run),
        "all_calls": summarise(calls),
        "by_stage": by_stage(staged),
    }
    md = render(res)
    print(md)
    write_results(NAME, res, f"# {NAME}\n\n{md}")


if __name__ == "__main__":
    main()
