"""The runs the data-parallel tests compare: their argument lists, and the 1-process runs every
multi-process job is compared with (built once per session, in this process: `one_process`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.captures import Capture, arith, grpo_source, init_adapter, plugin, write_toml
from testkit.toy_runs import (
    OBJECTIVES,
    STATEFUL_MODULE,
    run_args,
    sha256_of,
    write_examples,
)
from twinrun.cli.main import run_cli


def with_flags(args: list[str], **flags: str) -> list[str]:
    """`args` with these flags' values replaced (or appended): batch_size="1" -> --batch-size 1."""
    out = list(args)
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def shape(objective: str, model: Path, examples: Path, out: Path) -> list[str]:
    """sft: 8 rows, one per forward, 3 forwards a step (steps of 3, 3, 2 forwards: neither a
    multiple of 2), a checkpoint after every step; the others as the pinned-bytes runs."""
    args = run_args(objective, model, examples, out, "--diag")
    if objective == "sft":
        args = with_flags(args, batch_size="1", accumulation="3", checkpoint_every="1")
    return args


def grpo_blocks(model: Path, data: Path, out: Path) -> list[str]:
    """GRPO with 3 prompt groups a step decoded in blocks of 2 (block 0: groups 0-1, on rank 0
    of 2; block 1: group 2, on rank 1), prompts of unequal lengths, so blocks are left-padded."""
    examples = data / "arith-mixed.jsonl"
    pairs = ((1, 2), (12, 345), (7, 88), (1234, 5), (3, 3))
    examples.write_text(
        "".join(
            json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
            for a, b in pairs
        )
    )
    args = run_args("grpo", model, examples, out, "--diag")
    return with_flags(args, prompts_per_step="3", rollout_block="2")


def grpo_env(model: Path, examples: Path, out: Path, flags: dict[str, str]) -> list[str]:
    """GRPO with one prompt group per block (group 0 on rank 0 of 2, group 1 on rank 1), on
    the environment `flags["env"]`, without the replay buffer."""
    args = run_args("grpo", model, examples, out, "--diag")
    cut = args.index("--replay")
    return with_flags(args[:cut] + args[cut + 10 :], rollout_block="1", token_cap="12", **flags)


EXTRA_GRPO = {
    # a single-turn plugin that counts its calls: one instance per prompt group, so its state
    # cannot run from one group (or process) into the next
    "grpo-stateful": {"env": f"{STATEFUL_MODULE}:make"},
    # multi-turn: the calculator nudges the untrained model until the turn limit; one step (its
    # prompts, tool spec included, run to several hundred tokens: the costliest run of the set)
    "grpo-tools": {
        "env": "calculator",
        "max_turns": "2",
        "tool_timeout": "30",
        "steps": "1",
        "warmup_steps": "0",
    },
}


def timeless(rows: list[dict]) -> list[dict]:
    """Metrics rows without their wall times (`wall_s`, `rollout_s`, ...)."""
    return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]


@dataclass
class OneProcess:
    """The 1-process runs: `one[name]` their outputs, `args[name]` their argument lists."""

    root: Path
    data: Path
    one: dict[str, Path]
    args: dict[str, list[str]]
    grpo_capture: dict  # a GRPO source config that captures (its output still to be set)

    def elsewhere(self, name: str, out: Path, *extra: str) -> list[str]:
        """Run `name`'s arguments with another output (and `extra` flags)."""
        return [*with_flags(self.args[name], output=str(out)), *extra]


def one_process_runs(root: Path, model: Path) -> OneProcess:
    """Every objective shaped as `shape`, the GRPO blocks and the extra environments, run once."""
    data = root / "data"
    examples = write_examples(data)
    env = plugin(data)
    init = init_adapter(root / "init", model)
    source = grpo_source(model, arith(data), env, init, root / "capture")
    one, args = {}, {}
    for objective in OBJECTIVES:
        one[objective] = root / "one" / objective
        args[objective] = shape(objective, model, examples[objective], one[objective])
    one["grpo-blocks"] = root / "one" / "grpo-blocks"
    args["grpo-blocks"] = grpo_blocks(model, data, one["grpo-blocks"])
    for name, flags in EXTRA_GRPO.items():
        one[name] = root / "one" / name
        args[name] = grpo_env(model, examples["grpo"], one[name], flags)
    # batch-invariant: 8 rows, batch 1 x accumulation 4 (the 2-process run splits them 2 x 2)
    one["sft-invariant"] = root / "one" / "sft-invariant"
    args["sft-invariant"] = with_flags(
        run_args("sft", model, examples["sft"], one["sft-invariant"], "--batch-invariant"),
        batch_size="1", accumulation="4",
    )  # fmt: skip
    # evaluation inside training: every process scores every evaluation batch after each step
    one["sft-eval"] = root / "one" / "sft-eval"
    args["sft-eval"] = run_args(
        "sft", model, examples["sft"], one["sft-eval"], "--diag", "--eval-examples",
        str(examples["sft"]), "--eval-every", "1",
    )  # fmt: skip
    for name in one:
        assert run_cli(args[name]) == 0, name
    return OneProcess(root, data, one, args, source)


def resumable(run: Path, to: Path) -> Path:
    """A copy of a checkpointed run as a kill before its end leaves it (no final files)."""
    shutil.copytree(run, to)
    for name in ("adapter_model.safetensors", "adapter_config.json", "twinrun.json"):
        (to / name).unlink()
    return to


def replays_twice_gate_b(cap: Capture, folder: Path, capsys: Any, **sections: dict) -> None:
    """Two replays of `cap` on this one process (the config's `sections` changed), gate B
    passes, and the replay's final adapter is the capture's."""
    for name in ("r1", "r2"):
        doc = cap.replay_config(folder / name, **sections)
        assert run_cli(["run", str(write_toml(folder / f"{name}.toml", doc)), "--quiet"]) == 0
    capsys.readouterr()
    rc = run_cli(["evidence", str(cap.out), str(folder / "r1"), str(folder / "r2"),
                  "--require", "B", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["gates"]["B"]["ok"]
    final = sha256_of(cap.out / "final" / "adapter_model.safetensors")
    assert sha256_of(folder / "r1" / "final" / "adapter_model.safetensors") == final
