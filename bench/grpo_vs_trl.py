"""Benchmark: a GRPO step in twinrun vs TRL's GRPOTrainer, same model and config, one run.

Both train a LoRA (rank 8, alpha 16, q/k/v/o projections) with no KL term on the shipped
arithmetic prompts (`src/twinrun/examples/arith.jsonl`, chat template on, reward 1 for the exact
integer answer): 4 prompts x group 4 = 16 completions a step, <= 16 new tokens, temperature 1,
no top-k / top-p, learning rate 1e-3, one torch thread, f32, the 16 rows in one update forward.

- twinrun: `python -m twinrun tune grpo ... --batch-size 16 --threads 1`; a step's time is its
  `wall_s` in metrics.jsonl (rollouts: the default `--rollout-block 4`, so the step's 4 prompt
  groups, 16 rows, are decoded as one left-padded batch, as TRL does).
- TRL: `bench/trl_grpo_child.py` in the benchmark's own environment `bench/.venv-trl` (made by
  this script: a venv that sees this interpreter's packages through a .pth file, plus
  `pip install trl==TRL_VERSION`; TRL is never a dependency of twinrun); a step's time is
  on_step_begin -> on_step_end of a TrainerCallback (generation of all 16 rows as one left-padded
  batch, rewards, the loss forward/backward, the optimizer step).

The two alternate process by process (`--rounds` rounds, which goes first alternating); step 0
of each process is a warm-up, left out. twinrun / TRL is the ratio of the medians over all timed
steps; each round's ratio gives its spread. `--smollm2` adds the same comparison on SmolLM2-135M
(`python -m testkit.smollm2` builds/caches it) with fewer steps. A cProfile of twinrun's
rollout (the four groups of one step) is recorded when the goal is not met, and always a per-part
timing of one update (forward, float64 logprobs over every position vs over the kept positions
only, backward).

`--portable` adds a third arm to every comparison: twinrun in the portable mode
(`--cpu-kernels portable`: the same bytes on every CPU), timed in the same rounds, alternating
with the other two, and its own ratio to TRL.

    python -m bench grpo_vs_trl [--rounds 3] [--steps 8] [--smollm2] [--portable] [--quick]

Writes bench/results/grpo_vs_trl.json, .md and the `grpo_vs_trl` section of docs/benchmarks.md
(`--quick`: 1 round of 4 steps, prints only).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import cpu_name, git, package_versions, smollm2_dir, update_docs_section, write_toy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "arith.jsonl"
TRL_ENV = ROOT / "bench" / ".venv-trl"
TRL_VERSION = "1.16.0"
GOAL = 1.0  # twinrun step / TRL step

SETTINGS = {
    "seed": 1, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16,
    "temperature": 1.0, "learning_rate": 1e-3, "lora_rank": 8, "lora_alpha": 16,
}  # fmt: skip


def trl_python() -> Path:
    """The TRL environment's interpreter, made on first use."""
    py = TRL_ENV / "bin" / "python"
    probe = [str(py), "-c", f"import trl; assert trl.__version__ == {TRL_VERSION!r}"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    subprocess.run([sys.executable, "-m", "venv", str(TRL_ENV)], check=True)
    site = subprocess.run(
        [str(py), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    here = subprocess.run(
        [sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "twinrun-base.pth").write_text(here + "\n", encoding="utf-8")
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}"])
    if proc.returncode != 0:
        sys.exit(f"installing trl=={TRL_VERSION} into {TRL_ENV} failed")
    return py


def twinrun_steps(model: Path, work: Path, steps: int, kernels: str = "native") -> dict[str, Any]:
    s, out = SETTINGS, work / f"tw-{time.monotonic_ns()}"
    cmd = [
        sys.executable, "-m", "twinrun", "tune", "grpo", "--model", str(model),
        "--examples", str(EXAMPLES), "--output", str(out), "--seed", str(s["seed"]),
        "--steps", str(steps), "--prompts-per-step", str(s["prompts_per_step"]),
        "--group-size", str(s["group_size"]), "--max-new-tokens", str(s["max_new_tokens"]),
        "--temperature", str(s["temperature"]), "--batch-size", "16", "--clip-eps", "0.2",
        "--advantage-clip", "5", "--token-cap", "16", "--learning-rate", str(s["learning_rate"]),
        "--warmup-steps", "0", "--lr-schedule", "cosine",
        "--lora-rank", str(s["lora_rank"]),
        "--lora-alpha", str(s["lora_alpha"]), "--precision", "f32", "--chat-template", "on",
        "--env", "arithmetic", "--threads", "1", "--quiet", "--cpu-kernels", kernels,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"twinrun failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    return {
        "step_s": [r["wall_s"] for r in rows],
        "rollout_s": [r["rollout_s"] for r in rows],
        "update_s": [r["update_s"] for r in rows],
        "mean_completion_tokens": [r["active_tokens"] / 16 for r in rows],
    }


def trl_steps(py: Path, model: Path, work: Path, steps: int) -> dict[str, Any]:
    tag = time.monotonic_ns()
    settings = {**SETTINGS, "model": str(model), "examples": str(EXAMPLES), "steps": steps,
                "output": str(work / f"trl-{tag}")}  # fmt: skip
    sfile, ofile = work / f"trl-{tag}.json", work / f"trl-{tag}.out.json"
    sfile.write_text(json.dumps(settings), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run(
        [str(py), str(ROOT / "bench" / "trl_grpo_child.py"), str(sfile), str(ofile)],
        cwd=ROOT, capture_output=True, text=True, env=env,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"TRL failed:\n{proc.stderr[-3000:]}")
    got = json.loads(ofile.read_text())
    return {"step_s": got["step_s"], "mean_completion_tokens": got["completion_lengths"],
            "trl": got["trl"], "torch_threads": got["torch_threads"]}  # fmt: skip


def compare(
    py: Path, model: Path, work: Path, rounds: int, steps: int, portable: bool = False
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    arms = ("twinrun", "trl", "twinrun_portable") if portable else ("twinrun", "trl")
    for r in range(rounds):
        order = benchkit.alternating(arms, r)
        got = {}
        for who in order:
            if who == "trl":
                got[who] = trl_steps(py, model, work, steps)
            else:
                kernels = "portable" if who == "twinrun_portable" else "native"
                got[who] = twinrun_steps(model, work, steps, kernels)
        runs.append({"order": order, **got})
    portable_arm = _portable_arm(runs) if portable else {}
    tw = [x for run in runs for x in run["twinrun"]["step_s"][1:]]
    trl = [x for run in runs for x in run["trl"]["step_s"][1:]]
    per_round = [statistics.median(run["twinrun"]["step_s"][1:])
                 / statistics.median(run["trl"]["step_s"][1:]) for run in runs]  # fmt: skip
    roll = [x for run in runs for x in run["twinrun"]["rollout_s"][1:]]
    upd = [x for run in runs for x in run["twinrun"]["update_s"][1:]]
    return {
        "rounds": runs,
        "twinrun_step_s": benchkit.spread(tw, 4),
        "trl_step_s": benchkit.spread(trl, 4),
        "twinrun_rollout_s": benchkit.spread(roll, 4),
        "twinrun_update_s": benchkit.spread(upd, 4),
        "ratio": statistics.median(tw) / statistics.median(trl),
        "ratio_per_round": benchkit.spread(per_round, 3),
        "twinrun_mean_completion_tokens": statistics.mean(
            x for run in runs for x in run["twinrun"]["mean_completion_tokens"]),
        "trl_mean_completion_tokens": statistics.mean(
            x for run in runs for x in run["trl"]["mean_completion_tokens"]),
        **portable_arm,
    }  # fmt: skip


def _portable_arm(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The portable arm's step times, its ratios to TRL and to native twinrun (medians, and
    per round)."""
    pt = [x for run in runs for x in run["twinrun_portable"]["step_s"][1:]]
    tw = [x for run in runs for x in run["twinrun"]["step_s"][1:]]
    trl = [x for run in runs for x in run["trl"]["step_s"][1:]]

    def per_round(a: str, b: str) -> list[float]:
        return [statistics.median(run[a]["step_s"][1:]) / statistics.median(run[b]["step_s"][1:])
                for run in runs]  # fmt: skip

    return {
        "portable_step_s": benchkit.spread(pt, 4),
        "portable_rollout_s": benchkit.spread(
            [x for run in runs for x in run["twinrun_portable"]["rollout_s"][1:]], 4),
        "portable_update_s": benchkit.spread(
            [x for run in runs for x in run["twinrun_portable"]["update_s"][1:]], 4),
        "portable_ratio": statistics.median(pt) / statistics.median(trl),
        "portable_ratio_per_round": benchkit.spread(per_round("twinrun_portable", "trl"), 3),
        "portable_over_native": statistics.median(pt) / statistics.median(tw),
        "portable_over_native_per_round": benchkit.spread(
            per_round("twinrun_portable", "twinrun"), 3),
    }  # fmt: skip


def rollout_profile(model_dir: Path) -> list[str]:
    """cProfile of one step's rollout (its four prompt groups as one block), top entries by
    cumulative time."""
    import torch

    from twinrun.core.rng import stream
    from twinrun.model.build import load_causal_lm
    from twinrun.model.decoding import generate_block
    from twinrun.model.tokens import load_tokenizer

    torch.set_num_threads(1)
    model, tok = load_causal_lm(model_dir), load_tokenizer(model_dir)
    rows = [json.loads(x) for x in EXAMPLES.read_text().splitlines()[:4]]
    prompts = [tok.prompt_ids([{"role": "user", "content": r["prompt"]}], True) for r in rows]
    draws = [[lambda i, k=k, p=p: stream(1, "sample", 0, p, k, i).uniform() for k in range(4)]
             for p in range(len(prompts))]  # fmt: skip

    def step() -> None:
        generate_block(model, prompts, 16, 1.0, draws, end_ids=tok.end_ids)

    step()
    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(18)
    return [ln.rstrip() for ln in buf.getvalue().splitlines() if ln.strip()][:40]


def update_parts(model_dir: Path, repeats: int = 2) -> dict[str, Any]:
    """Per-part times of one GRPO update on a step's 16 sampled rows (one forward of 16 rows, LoRA
    on q/k/v/o): the model forward, the float64 logprobs of the predicted tokens — over every
    position (as before) and over the kept completion positions only (`kept_logprobs`, what
    twinrun runs) — and the backward. Medians over `repeats` passes."""
    import torch

    from twinrun.core.rng import stream
    from twinrun.model.build import load_causal_lm
    from twinrun.model.decoding import generate_block
    from twinrun.model.lora import apply_lora
    from twinrun.model.tokens import load_tokenizer
    from twinrun.objectives.grpo_logprobs import kept_logprobs

    torch.set_num_threads(1)
    model, tok = load_causal_lm(model_dir), load_tokenizer(model_dir)
    apply_lora(model.hf, 8, 16, 1, ["q_proj", "k_proj", "v_proj", "o_proj"])
    rows = [json.loads(x) for x in EXAMPLES.read_text().splitlines()[:4]]
    prompts = [tok.prompt_ids([{"role": "user", "content": r["prompt"]}], True) for r in rows]
    draws = [[lambda i, k=k, p=p: stream(1, "sample", 0, p, k, i).uniform() for k in range(4)]
             for p in range(len(prompts))]  # fmt: skip
    with torch.no_grad():
        done = generate_block(model, prompts, 16, 1.0, draws, end_ids=tok.end_ids)
    seqs = [(p, p + r.tokens) for p, group in zip(prompts, done, strict=True) for r in group]
    width = max(len(s) for _, s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    kept = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
    for i, (p, s) in enumerate(seqs):
        ids[i, : len(s)], attn[i, : len(s)] = torch.tensor(s), 1
        kept[i, len(p) - 1 : len(s) - 1] = True
    parts: dict[str, list[float]] = {
        k: [] for k in ("forward", "logprobs_all_positions", "logprobs_kept_positions", "backward")
    }
    zero = torch.zeros((), dtype=torch.float64)
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits = model(ids, attn)
        t1 = time.perf_counter()
        full = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        full = full.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        t2 = time.perf_counter()
        logp = kept_logprobs(logits, ids, kept, 1.0)
        t3 = time.perf_counter()
        (-torch.where(kept, logp, zero).sum()).backward()
        t4 = time.perf_counter()
        del full
        for key, x in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            parts[key].append(x)
        model.hf.zero_grad(set_to_none=True)
    return {"rows": len(seqs), "width": width, "kept_tokens": int(kept.sum()),
            "parts_s": {k: statistics.median(v) for k, v in parts.items()}}  # fmt: skip


def parts_table(name: str, u: dict[str, Any]) -> list[str]:
    s = u["parts_s"]
    return [
        f"Where the update's time goes ({name}: one forward of {u['rows']} rows × {u['width']} "
        f"tokens, {u['kept_tokens']} kept completion tokens; medians of 2 passes):", "",
        "| part | s |", "|---|---|",
        f"| model forward (logits at every position) | {s['forward']:.3f} |",
        f"| float64 logprobs over every position (before) | {s['logprobs_all_positions']:.3f} |",
        f"| float64 logprobs over kept positions (now) | {s['logprobs_kept_positions']:.3f} |",
        f"| backward | {s['backward']:.3f} |", "",
    ]  # fmt: skip


def _portable_rows(c: dict[str, Any]) -> list[str]:
    """The portable arm's rows of a comparison's table (none without `--portable`)."""
    if "portable_step_s" not in c:
        return []
    return [
        f"| twinrun step, portable mode | {fmt(c['portable_step_s'])} |",
        f"| — rollout | {fmt(c['portable_rollout_s'])} |",
        f"| — update | {fmt(c['portable_update_s'])} |",
        f"| **portable twinrun / TRL** | **{c['portable_ratio']:.2f}×** (per round "
        f"{fmt(c['portable_ratio_per_round'], 2)}); portable / native twinrun "
        f"{c['portable_over_native']:.2f}× |",
    ]


def fmt(s: dict[str, Any], d: int = 3) -> str:
    return f"{s['median']:.{d}f} ({s['min']:.{d}f}–{s['max']:.{d}f})"


def table(name: str, c: dict[str, Any]) -> list[str]:
    met = benchkit.verdict(c["ratio"] <= GOAL)
    return [
        f"### {name}", "",
        "| per step (s) | median (min–max) |", "|---|---|",
        f"| twinrun step | {fmt(c['twinrun_step_s'])} |",
        f"| — rollout | {fmt(c['twinrun_rollout_s'])} |",
        f"| — update | {fmt(c['twinrun_update_s'])} |",
        f"| TRL GRPOTrainer step | {fmt(c['trl_step_s'])} |",
        f"| **twinrun / TRL** | **{c['ratio']:.2f}×** (per round {fmt(c['ratio_per_round'], 2)}) |",
        *_portable_rows(c),
        "",
        f"Mean completion length: twinrun {c['twinrun_mean_completion_tokens']:.1f}, TRL "
        f"{c['trl_mean_completion_tokens']:.1f} tokens. Goal twinrun / TRL ≤ {GOAL}: {met}."
        + (f" The same in the portable mode: {benchkit.verdict(c['portable_ratio'] <= GOAL)}."
           if "portable_ratio" in c else ""), "",
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--smollm2", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--portable", action="store_true", help="also time the portable mode")
    a = ap.parse_args()
    rounds, steps = (1, 4) if a.quick else (a.rounds, a.steps)
    py = trl_python()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        toy = write_toy(work / "toy")
        result: dict[str, Any] = {"toy": compare(py, toy, work, rounds, steps, a.portable)}
        if result["toy"]["ratio"] > GOAL:
            result["toy"]["rollout_profile"] = rollout_profile(toy)
        result["toy"]["update_parts"] = update_parts(toy)
        if a.smollm2:
            sm = smollm2_dir()
            result["smollm2"] = compare(
                py, sm, work, max(1, rounds - 1), max(3, steps // 2), a.portable
            )
            if result["smollm2"]["ratio"] > GOAL:
                result["smollm2"]["rollout_profile"] = rollout_profile(sm)
            result["smollm2"]["update_parts"] = update_parts(sm)
    meta = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench grpo_vs_trl" + (" --smollm2" if a.smollm2 else "")
        + (" --portable" if a.portable else ""),
        "cpu": cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        **package_versions("torch", "transformers", "peft"), "trl": TRL_VERSION,
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "load_avg_start": load0, "load_avg_end": os.getloadavg()[0],
        "settings": SETTINGS, "rounds": rounds, "steps_per_process": steps,
    }  # fmt: skip
    lines = [
        f"Measured {meta['when']} by `{meta['command']}` on {meta['cpu_count']} CPUs "
        f"({meta['cpu']}), torch {meta['torch']}, transformers {meta['transformers']}, "
        f"peft {meta['peft']}, TRL {TRL_VERSION} (in `bench/.venv-trl` only), commit "
        f"{meta['git_commit']}; load average {load0:.2f} at start, {meta['load_avg_end']:.2f} at "
        f"end (a shared machine). {rounds} rounds × {steps} steps per process, step 0 of each "
        "left out; figures are median (min–max).", "",
    ]  # fmt: skip
    lines += table("Toy model (4 layers, hidden 64)", result["toy"])
    if "smollm2" in result:
        lines += table("SmolLM2-135M", result["smollm2"])
    for key in ("toy", "smollm2"):
        if "update_parts" in result.get(key, {}):
            lines += parts_table(key, result[key]["update_parts"])
    for key in ("toy", "smollm2"):
        if "rollout_profile" in result.get(key, {}):
            lines += [f"Where twinrun's rollout time goes ({key}, cProfile of one step's block "
                      "of four groups, top entries by cumulative time):", "", "```",
                      *result[key]["rollout_profile"], "```", ""]  # fmt: skip
    md = "\n".join(lines)
    print(md)
    if a.quick:
        return
    benchkit.write_results(
        "grpo_vs_trl", {"meta": meta, **result}, "# GRPO step: twinrun vs TRL\n\n" + md + "\n"
    )
    intro = (
        "twinrun and TRL's GRPOTrainer on the same model and config in one run "
        "(`python -m bench grpo_vs_trl`; TRL only in the benchmark's own environment)."
    )
    update_docs_section("grpo_vs_trl", "GRPO step: twinrun vs TRL", intro, md)


if __name__ == "__main__":
    main()
