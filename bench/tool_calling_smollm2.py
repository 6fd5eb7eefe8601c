"""Example and benchmark: SmolLM2-135M-Instruct learns to call a calculator tool — a short SFT on
tool-calling conversations, then multi-turn GRPO in the built-in `calculator` environment, with
the reward per step, how often the model's calls work, and the peak memory.

The task is two-digit multiplication ("What is 47 * 27?"), which a 135M model cannot do in its
head: the reward (1.0 when the final turn starts with the product) comes from calling the tool
and copying its answer. The base model never calls it in the environment's format (it answers in
prose; reward 0 on every episode, so GRPO has no signal), so:

1. `tune sft` on `--sft-rows` conversations in the environment's own words — the system message
   listing the tool (SmolLM2's template does not render `tools`, so the schema goes in the system
   text, as the environment writes it), the environment's first user message, an assistant turn
   with a `<tool_call>`, the tool's result, the answer — every assistant turn trained. Few rows
   on purpose: the model learns the format only in part, so the environment has something to
   teach;
2. `tune grpo --env calculator --max-turns 3 --init-adapter <the SFT run>` on fresh problems,
   `--log-completions` writing every episode, `--gradient-checkpointing` for the long rows;
3. (unless `--no-single`) one single-turn GRPO process at the same settings from the same
   adapter (`--env arithmetic`, the same rows) for the peak-memory ratio.

Every command is a fresh `python -m twinrun` process; its peak RSS and CPU time come from
`os.wait4`. Per GRPO step: the reward's mean and spread (metrics.jsonl) and, from the episodes in
completions.jsonl, the share of episodes with a tool call that ran (a tool reply that is not an
`error:`), the share with a call that failed, the model turns per episode and the step's times.

    python -m bench tool_calling_smollm2 [--sft-rows 28] [--steps 16] [--work DIR] [--no-single]
    python -m bench tool_calling_smollm2 --render   # the .md and docs again, from the JSON

Writes bench/results/tool_calling_smollm2.json and .md, the `tool_calling_smollm2` section of
docs/benchmarks.md and the figures docs/tool-environments.md quotes. The runs stay in `--work`
(default: a temporary directory, removed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import cpu_name, git, package_versions, smollm2_dir, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
TOOL_DOCS = ROOT / "docs" / "tool-environments.md"
NAME = "tool_calling_smollm2"
COMMON = [
    "--lora-rank", "8", "--lora-alpha", "16", "--precision", "f32", "--chat-template", "on",
    "--threads", "2", "--warmup-steps", "0", "--lr-schedule", "constant", "--quiet",
]  # fmt: skip
SFT = ["--seed", "0", "--epochs", "1", "--batch-size", "4", "--accumulation", "1",
       "--learning-rate", "5e-4"]  # fmt: skip
GRPO = [
    "--seed", "1", "--prompts-per-step", "4", "--group-size", "4", "--batch-size", "16",
    "--max-new-tokens", "40", "--temperature", "1.0", "--clip-eps", "0.2",
    "--advantage-clip", "5", "--token-cap", "128", "--learning-rate", "2e-4",
    "--log-completions", "16", "--gradient-checkpointing",
]  # fmt: skip
TOOL = ["--env", "calculator", "--max-turns", "3", "--tool-timeout", "10"]


def problems(rng: random.Random, n: int) -> list[tuple[int, int]]:
    return [(rng.randint(11, 99), rng.randint(11, 99)) for _ in range(n)]


def sft_row(a: int, b: int) -> dict[str, Any]:
    """One conversation in the calculator environment's own words: its system text and first
    user message (asked of the environment itself), a call, the result, the answer."""
    from twinrun.core.rng import stream
    from twinrun.rl.environments import open_environment
    from twinrun.rl.tool_calls import tools_system_text

    row = {"prompt": f"What is {a} * {b}?", "answer": str(a * b)}
    env = open_environment("calculator", max_turns=2, timeout_s=10.0)
    episode = env.episode(row, stream(0, "example", a, b))
    first, tools = episode.start(), list(episode.tools)
    episode.close()
    call = {"name": "calculate", "arguments": {"expression": f"{a} * {b}"}}
    return {"messages": [
        {"role": "system", "content": tools_system_text(tools)},
        {"role": "user", "content": first},
        {"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": str(a * b)},
    ]}  # fmt: skip


def write_data(work: Path, sft_rows: int) -> tuple[Path, Path]:
    """The SFT conversations and the GRPO prompts (other problems), from one seeded generator."""
    rng = random.Random(7)
    sft, prompts = work / "tool_sft.jsonl", work / "tool_prompts.jsonl"
    sft.write_text("".join(json.dumps(sft_row(a, b)) + "\n" for a, b in problems(rng, sft_rows)))
    prompts.write_text("".join(
        json.dumps({"prompt": f"What is {a} * {b}?", "answer": str(a * b)}) + "\n"
        for a, b in problems(rng, 64)
    ))  # fmt: skip
    return sft, prompts


def twinrun(args: list[str]) -> dict[str, float]:
    """One `python -m twinrun ARGS` process: its wall and CPU seconds and peak RSS (MiB)."""
    print("$ twinrun " + shlex.join(args), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "twinrun", *args], cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"twinrun {args[0]} {args[1]} failed (exit {status})")
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def episode_stats(lines: list[dict[str, Any]]) -> dict[str, float]:
    """Of a step's logged episodes: the share with a tool call that ran, with one that failed,
    and the model turns per episode."""
    ran = failed = turns = 0
    for e in lines:
        replies = [m for t in e.get("turns", []) for m in t.get("observation", [])
                   if m.get("role") == "tool"]  # fmt: skip
        ran += any(not m["content"].startswith("error:") for m in replies)
        failed += any(m["content"].startswith("error:") for m in replies)
        turns += len(e.get("turns", []))
    n = max(len(lines), 1)
    return {"call_ran": ran / n, "call_failed": failed / n, "turns": turns / n}


def per_step(run: Path) -> list[dict[str, Any]]:
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    return [
        {
            "step": m["step"], "reward_mean": m["reward_mean"], "reward_std": m["reward_std"],
            "rollout_s": m["rollout_s"], "update_s": m["update_s"], "wall_s": m["wall_s"],
            **episode_stats([e for e in logged if e["step"] == m["step"]]),
        }
        for m in metrics
    ]  # fmt: skip


def measure(work: Path, a: argparse.Namespace) -> dict[str, Any]:
    model = str(smollm2_dir())
    sft_data, prompts = write_data(work, a.sft_rows)
    sft_out, grpo_out, single_out = work / "sft", work / "grpo", work / "single"
    sft_args = ["tune", "sft", "--model", model, "--examples", str(sft_data),
                "--output", str(sft_out), *SFT, *COMMON]  # fmt: skip
    grpo_args = ["tune", "grpo", "--model", model, "--examples", str(prompts),
                 "--output", str(grpo_out), "--steps", str(a.steps), *GRPO, *TOOL,
                 "--init-adapter", str(sft_out), *COMMON]  # fmt: skip
    res: dict[str, Any] = {"sft": twinrun(sft_args)}
    res["sft"]["loss"] = [json.loads(x)["loss"] for x in (sft_out / "metrics.jsonl").read_text()
                          .splitlines()]  # fmt: skip
    res["grpo"] = twinrun(grpo_args)
    res["steps"] = per_step(grpo_out)
    if not a.no_single:
        single = [x if x != str(grpo_out) else str(single_out) for x in grpo_args]
        cut = single.index("--env")
        single[cut : cut + len(TOOL)] = ["--env", "arithmetic"]
        single[single.index("--steps") + 1] = "2"
        res["single_turn"] = twinrun(single)
    shown = {"sft": sft_args, "grpo": grpo_args}
    res["commands"] = {k: "twinrun " + shlex.join(v).replace(model, "$SMOLLM2").replace(
        str(work), "runs") for k, v in shown.items()}  # fmt: skip
    res["adapter_sha256"] = json.loads((grpo_out / "twinrun.json").read_text())["adapter"]["sha256"]
    return res


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def headline(res: dict[str, Any]) -> str:
    """The sentence docs/tool-environments.md quotes."""
    steps, third = res["steps"], max(1, len(res["steps"]) // 3)
    first, last = steps[:third], steps[-third:]
    ratio = ""
    if "single_turn" in res:
        ratio = (f" ({res['grpo']['peak_rss_mib'] / res['single_turn']['peak_rss_mib']:.2f}× a "
                 f"single-turn GRPO process at the same settings, "
                 f"{res['single_turn']['peak_rss_mib']:.0f} MiB)")  # fmt: skip
    return (
        f"On {res['cpus']} CPUs ({res['cpu']}), {res['when']}, commit {res['git']} (`python "
        f"bench/tool_calling_smollm2.py`): the SFT's loss went {res['sft']['loss'][0]:.3f} → "
        f"{res['sft']['loss'][-1]:.3f} in {len(res['sft']['loss'])} steps; over "
        f"{len(steps)} GRPO steps of 16 episodes the mean reward went from "
        f"**{mean([s['reward_mean'] for s in first]):.2f}** (steps 0–{third - 1}) to "
        f"**{mean([s['reward_mean'] for s in last]):.2f}** (the last {third}), and the share of "
        f"episodes whose tool call ran from {mean([s['call_ran'] for s in first]):.2f} to "
        f"{mean([s['call_ran'] for s in last]):.2f}; a GRPO step took "
        f"{statistics.median([s['wall_s'] for s in steps]):.0f} s (median; "
        f"{min(s['wall_s'] for s in steps):.0f}–{max(s['wall_s'] for s in steps):.0f}); the GRPO "
        "process peaked at "
        f"{res['grpo']['peak_rss_mib']:.0f} MiB RSS{ratio}."
    )


def render(res: dict[str, Any]) -> str:
    lines = [
        f"Measured {res['when']} by `{res['command']}` on {res['cpus']} CPUs ({res['cpu']}), "
        f"torch {res['versions']['torch']}, transformers {res['versions']['transformers']}, "
        f"commit {res['git']}; load average {res['load'][0]:.2f} at start, "
        f"{res['load'][1]:.2f} at end (a shared machine: the times are indicative). "
        "SmolLM2-135M-Instruct, two threads, f32, LoRA rank 8 / alpha 16 on q/k/v/o.",
        "",
        "<!-- doc-test: skip (SmolLM2 training for half an hour: the benchmark runs it) -->",
        "```bash",
        res["commands"]["sft"],
        res["commands"]["grpo"],
        "```",
        "",
        headline(res),
        "",
        "| GRPO step | reward mean ± std | episodes whose call ran | with a failed call | "
        "model turns per episode | rollout s | update s |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in res["steps"]:
        lines.append(
            f"| {s['step']} | {s['reward_mean']:.3f} ± {s['reward_std']:.3f} | "
            f"{s['call_ran']:.2f} | {s['call_failed']:.2f} | {s['turns']:.2f} | "
            f"{s['rollout_s']:.1f} | {s['update_s']:.1f} |"
        )
    lines += ["", "| process | wall s | CPU s | peak RSS MiB |", "|---|---|---|---|"]
    for name in ("sft", "grpo", "single_turn"):
        if name in res:
            p = res[name]
            lines.append(f"| {name} | {p['wall_s']:.0f} | {p['cpu_s']:.0f} | "
                         f"{p['peak_rss_mib']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-rows", type=int, default=28, help="SFT conversations (batch 4)")
    ap.add_argument("--steps", type=int, default=16, help="GRPO steps")
    ap.add_argument("--work", type=Path, help="keep the runs here (default: a temporary dir)")
    ap.add_argument("--no-single", action="store_true", help="skip the single-turn process")
    ap.add_argument("--render", action="store_true", help="rewrite the .md and docs from the JSON")
    a = ap.parse_args()
    if a.render:
        write(json.loads((RESULTS / f"{NAME}.json").read_text()))
        return
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        res = measure(work, a)
    res.update({
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench tool_calling_smollm2 " + shlex.join(sys.argv[1:]),
        "cpu": cpu_name(), "cpus": os.cpu_count(), "git": git("rev-parse", "--short", "HEAD"),
        "load": [load0, os.getloadavg()[0]],
        "versions": package_versions("torch", "transformers", "peft"),
    })  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{NAME}.json").write_text(json.dumps(res, indent=2) + "\n")
    write(res)


def write(res: dict[str, Any]) -> None:
    """The .md, the docs/benchmarks.md section and the sentence docs/tool-environments.md
    quotes, from the results."""
    body = render(res)
    (RESULTS / f"{NAME}.md").write_text(
        "# SmolLM2 learns to call a tool: SFT, then multi-turn GRPO\n\n" + body + "\n"
    )
    update_docs_section(
        NAME, "SmolLM2 learns to call a tool: SFT, then multi-turn GRPO",
        "A short tool-calling SFT, then GRPO in the calculator environment, on "
        "SmolLM2-135M-Instruct. Generated by `python -m bench tool_calling_smollm2` (also in "
        f"`bench/results/{NAME}.md`); do not edit between the markers.",
        body,
    )  # fmt: skip
    update_docs_section(f"{NAME}_figures", "", "", headline(res), docs=TOOL_DOCS)
    print(body)


if __name__ == "__main__":
    main()
