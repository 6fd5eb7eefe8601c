"""Benchmark: GRPO step time (rollout vs update) and sampling speed vs Hugging Face `generate`.

Both parts use the toy model (`python -m twinrun toy-model DIR --seed 0`, made once in a
temporary directory), one torch thread and f32.

1. GRPO steps. One `python -m twinrun tune grpo` process on the shipped arithmetic prompts
   (`src/twinrun/examples/arith.jsonl`, env `arithmetic`), `--threads 1`, 4 prompts per step x
   group size 4, 16 new tokens at most, temperature 1, batch size 8, LoRA rank 8. Each step's
   `rollout_s` (environment prompts, sampling, rewards, advantages) and `update_s` (PPO-clip
   forwards + backwards) are read from its metrics.jsonl; `wall_s` minus both is the rest (AdamW
   step, bookkeeping). Step 0 is a warm-up and is left out of the medians (it is reported).
2. Generation tokens/s, in this process: twinrun's KV-cached sampler
   (`twinrun.model.decoding.generate`, uniform draws from `twinrun.core.rng.stream`, no end ids)
   against HF `AutoModelForCausalLM.from_pretrained(toy, attn_implementation="eager").generate(
   do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=32)` with the EOS token
   removed from its generation config, so both always emit exactly 32 tokens (checked on every
   call). Same prompts (the first arithmetic prompts, chat template on, as GRPO builds them), one
   prompt per call, alternating which sampler runs first on every call. Per repeat, tokens/s =
   all tokens / all time over the prompts; reported as median (min-max) over repeats, in wall and
   in CPU time (`time.process_time`, less disturbed by other jobs on a shared machine).
   twinrun/HF is the ratio of the medians; the per-repeat ratios give its spread. A cProfile pass
   over twinrun's `generate` splits its time into model forwards, sampling and the draws.

    python -m bench grpo [--quick] [--steps 10] [--repeats 15] [--prompts 8] [--new-tokens 32]

Writes bench/results/grpo.json, bench/results/grpo.md and the section between
`<!-- grpo:begin -->` and `<!-- grpo:end -->` in docs/benchmarks.md. `--quick` (4 steps,
2 repeats, 3 prompts) is a smoke run: it prints the table and writes nothing unless `--write`.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import datetime as dt
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import git, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
DOCS = ROOT / "docs" / "benchmarks.md"
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "arith.jsonl"
RATIO_GOAL = 1.0  # twinrun tokens/s >= HF tokens/s

GRPO_SETTINGS = {
    "seed": 1,
    "prompts_per_step": 4,
    "group_size": 4,
    "max_new_tokens": 16,
    "temperature": 1.0,
    "batch_size": 8,
    "clip_eps": 0.2,
    "advantage_clip": 5.0,
    "token_cap": 16,
    "learning_rate": 1e-3,
    "warmup_steps": 0,
    "lr_schedule": "cosine",
    "lora_rank": 8,
    "lora_alpha": 16,
    "precision": "f32",
    "chat_template": "on",
    "env": "arithmetic",
    "threads": 1,
}


# ---------------------------------------------------------------- helpers


def spread(xs: list[float]) -> dict[str, Any]:
    return {**benchkit.spread(xs, 6), "n": len(xs)}


def fmt(s: dict[str, Any], digits: int = 3) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def machine() -> dict[str, Any]:
    dirty = git("status", "--porcelain", "--", "src").splitlines()
    return benchkit.machine("torch", "transformers", "numpy") | {
        "src_uncommitted": [ln[3:] for ln in dirty],  # measured code = commit + these changes
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
    }


def grpo_command(model: Path, out: Path, steps: int) -> list[str]:
    s = GRPO_SETTINGS
    return [
        sys.executable, "-m", "twinrun", "tune", "grpo",
        "--model", str(model), "--examples", str(EXAMPLES), "--output", str(out),
        "--seed", str(s["seed"]), "--steps", str(steps),
        "--prompts-per-step", str(s["prompts_per_step"]), "--group-size", str(s["group_size"]),
        "--max-new-tokens", str(s["max_new_tokens"]), "--temperature", str(s["temperature"]),
        "--batch-size", str(s["batch_size"]), "--clip-eps", str(s["clip_eps"]),
        "--advantage-clip", str(s["advantage_clip"]), "--token-cap", str(s["token_cap"]),
        "--learning-rate", str(s["learning_rate"]), "--warmup-steps", str(s["warmup_steps"]),
        "--lr-schedule", "cosine",
        "--lora-rank", str(s["lora_rank"]), "--lora-alpha", str(s["lora_alpha"]),
        "--precision", str(s["precision"]), "--chat-template", str(s["chat_template"]),
        "--env", str(s["env"]), "--threads", str(s["threads"]), "--quiet",
    ]  # fmt: skip


def measure_grpo(model: Path, work: Path, steps: int) -> dict[str, Any]:
    out = work / "grpo-run"
    cmd = grpo_command(model, out, steps)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    process_wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != steps:
        sys.exit(f"expected {steps} metrics rows, got {len(rows)}")
    per_step = [
        {
            "step": r["step"],
            "rollout_s": r["rollout_s"],
            "update_s": r["update_s"],
            "other_s": r["wall_s"] - r["rollout_s"] - r["update_s"],
            "wall_s": r["wall_s"],
            "completion_tokens": r["active_tokens"],
            "rows": r["rows"],
            "reward_mean": r["reward_mean"],
            "loss": r["loss"],
        }
        for r in rows
    ]
    timed = per_step[1:]  # step 0 is the warm-up
    summary = {
        key: spread([r[key] for r in timed])
        for key in ("rollout_s", "update_s", "other_s", "wall_s", "completion_tokens")
    }
    summary["rollout_share"] = spread([r["rollout_s"] / r["wall_s"] for r in timed])
    summary["rollout_over_update"] = spread([r["rollout_s"] / r["update_s"] for r in timed])
    summary["rollout_tokens_per_s"] = spread(
        [r["completion_tokens"] / r["rollout_s"] for r in timed]
    )
    return {
        "command": " ".join(["python", *cmd[1:]]).replace(str(ROOT) + "/", ""),
        "steps": steps,
        "process_wall_s": process_wall,
        "per_step": per_step,
        "step0": per_step[0],
        "summary": summary,
        "zero_reward_steps": sum(r["reward_mean"] == 0.0 for r in per_step),
    }


# ---------------------------------------------------------------- part 2: generation


def measure_generation(
    model_dir: Path, repeats: int, n_prompts: int, new_tokens: int
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from twinrun.core.rng import stream
    from twinrun.data.examples import load_rows
    from twinrun.model.build import load_causal_lm
    from twinrun.model.decoding import generate
    from twinrun.model.tokens import load_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)  # HF samples with torch's global generator
    tok = load_tokenizer(model_dir)
    twin = load_causal_lm(model_dir, precision="f32", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(
        str(model_dir), attn_implementation="eager", dtype=torch.float32
    ).eval()
    # Never stop early: exactly `new_tokens` tokens, as twinrun with no end ids. generate()
    # fills a None in the passed config from the model's own config, so clear it there too.
    hf.generation_config.eos_token_id = None
    gen_cfg = copy.deepcopy(hf.generation_config)
    gen_cfg.do_sample, gen_cfg.top_k, gen_cfg.top_p, gen_cfg.temperature = True, 0, 1.0, 1.0
    gen_cfg.max_new_tokens = new_tokens
    gen_cfg.pad_token_id = tok.pad_id

    rows = load_rows(EXAMPLES)[:n_prompts]
    prompts = [tok.prompt_ids([{"role": "user", "content": r.data["prompt"]}], True) for r in rows]

    # Same model: compare the prompt logits of both implementations once.
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        max_logit_diff = float((twin(ids) - hf(ids).logits).abs().max())

    def run_twinrun(i: int, rep: int) -> list[int]:
        def draw(position: int) -> float:
            return stream(7, "bench", rep, i, position).uniform()

        return generate(twin, prompts[i], new_tokens, 1.0, draw=draw).tokens

    def run_hf(i: int, rep: int) -> list[int]:
        ids = torch.tensor([prompts[i]], dtype=torch.long)
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)
        return [int(x) for x in out[0, ids.shape[1] :]]

    runners = {"twinrun": run_twinrun, "hf": run_hf}
    for i in range(min(2, len(prompts))):  # warm-up, untimed
        for f in runners.values():
            f(i, 99_999)

    per_rep: dict[str, list[dict[str, float]]] = {k: [] for k in runners}
    per_call: dict[str, list[float]] = {k: [] for k in runners}
    eos_emitted = {k: 0 for k in runners}  # EOS tokens sampled and generated past
    pair_ratios: list[float] = []  # per (repeat, prompt): twinrun tok/s / HF tok/s, adjacent calls
    for rep in range(repeats):
        acc = {k: {"tokens": 0, "wall": 0.0, "cpu": 0.0} for k in runners}
        for i in range(len(prompts)):
            pair: dict[str, float] = {}
            order = ("twinrun", "hf") if (rep + i) % 2 == 0 else ("hf", "twinrun")
            for name in order:
                c0, t0 = time.process_time(), time.perf_counter()
                out = runners[name](i, rep)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                n = len(out)
                eos_emitted[name] += out.count(tok.eos_id)
                if n != new_tokens:
                    sys.exit(f"{name} generated {n} tokens, expected {new_tokens}")
                acc[name]["tokens"] += n
                acc[name]["wall"] += wall
                acc[name]["cpu"] += cpu
                per_call[name].append(n / wall)
                pair[name] = n / wall
            pair_ratios.append(pair["twinrun"] / pair["hf"])
        for name, a in acc.items():
            per_rep[name].append(
                {
                    "tokens_per_s": a["tokens"] / a["wall"],
                    "cpu_tokens_per_s": a["tokens"] / a["cpu"],
                }
            )
        print(
            f"  generation repeat {rep + 1}/{repeats}: twinrun "
            f"{per_rep['twinrun'][-1]['tokens_per_s']:.0f} tok/s, HF "
            f"{per_rep['hf'][-1]['tokens_per_s']:.0f} tok/s",
            file=sys.stderr,
            flush=True,
        )

    res: dict[str, Any] = {
        "prompts": len(prompts),
        "prompt_lengths": [len(p) for p in prompts],
        "new_tokens": new_tokens,
        "repeats": repeats,
        "max_abs_prompt_logit_diff": max_logit_diff,
        "eos_tokens_emitted_without_stopping": eos_emitted,
        "hf_generation_config": gen_cfg.to_diff_dict(),
    }
    for name in runners:
        res[name] = {
            "tokens_per_s": spread([r["tokens_per_s"] for r in per_rep[name]]),
            "cpu_tokens_per_s": spread([r["cpu_tokens_per_s"] for r in per_rep[name]]),
            "per_call_tokens_per_s": spread(per_call[name]),
        }
    for kind in ("tokens_per_s", "cpu_tokens_per_s"):
        res[f"ratio_{kind}"] = res["twinrun"][kind]["median"] / res["hf"][kind]["median"]
        res[f"ratio_{kind}_per_repeat"] = spread(
            [a[kind] / b[kind] for a, b in zip(per_rep["twinrun"], per_rep["hf"], strict=True)]
        )
    res["ratio_tokens_per_s_per_call_pair"] = spread(pair_ratios)
    res["twinrun_profile"] = profile_twinrun(run_twinrun, len(prompts))
    return res


def profile_twinrun(run_twinrun: Any, n_prompts: int) -> dict[str, Any]:
    """Where twinrun's generate spends its time (cProfile, which inflates Python overhead)."""
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n_prompts):
        run_twinrun(i, 10_000)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]

    def cum(file_tail: str, func: str) -> float:
        return sum(
            v[3]
            for (file, _, name), v in stats.items()
            if file.endswith(file_tail) and name == func
        )

    total = cum("model/decoding.py", "generate")
    parts = {
        "model_forward (CausalLM.run)": cum("model/build.py", "run"),
        "sample_rows (softmax, cumsum, search)": cum("model/decoding.py", "sample_rows"),
        "draw (twinrun.core.rng.stream(...).uniform())": cum("bench/grpo.py", "draw"),
    }
    parts["rest (loop, tensor creation)"] = total - sum(parts.values())
    return {"total_s": total, "share": {k: v / total for k, v in parts.items()}}


# ---------------------------------------------------------------- report


def markdown(res: dict[str, Any]) -> str:
    m, g, s = res["machine"], res["grpo"], res["generation"]
    gs = GRPO_SETTINGS
    sm = g["summary"]
    quick = " --quick" if res["quick"] else ""
    lines = [
        f"Measured {res['date']} by `python -m bench grpo{quick}` on {m['cpu_count']} CPUs "
        f"({m['cpu']}), torch {m['torch']}, transformers {m['transformers']}, Python "
        f"{m['python']}, commit {m['git_commit']}"
        f"{' + uncommitted changes in src/' if m['src_uncommitted'] else ''}; load average "
        f"{res['loadavg_start'][0]:.2f} at start, {res['loadavg_end'][0]:.2f} at end "
        "(the machine is shared, hence medians). Toy "
        "model (`twinrun toy-model --seed 0`: 4 layers, hidden 64, vocab 259), torch threads 1, "
        "f32. Figures: median (min–max).",
        "",
        "### GRPO step: rollout vs update",
        "",
        f"One `twinrun tune grpo` process, {g['steps']} steps: env `{gs['env']}` on "
        f"`src/twinrun/examples/arith.jsonl`, {gs['prompts_per_step']} prompts × group "
        f"{gs['group_size']} = {gs['prompts_per_step'] * gs['group_size']} completions per step, "
        f"≤ {gs['max_new_tokens']} new tokens, temperature {gs['temperature']:g}, batch size "
        f"{gs['batch_size']}, LoRA rank {gs['lora_rank']}, chat template on, `--threads 1`. "
        "rollout = prompts + sampling + rewards + advantages; update = PPO-clip forwards and "
        "backwards; other = `wall_s` − both (AdamW step, bookkeeping). Over steps 1–"
        f"{g['steps'] - 1} (step 0, the warm-up, excluded: rollout "
        f"{g['step0']['rollout_s']:.3f} s, update {g['step0']['update_s']:.3f} s).",
        "",
        "| per step | median (min–max) |",
        "|---|---|",
        f"| rollout s | {fmt(sm['rollout_s'])} |",
        f"| update s | {fmt(sm['update_s'])} |",
        f"| other s | {fmt(sm['other_s'])} |",
        f"| step wall s | {fmt(sm['wall_s'])} |",
        f"| rollout / update | {fmt(sm['rollout_over_update'], 1)} |",
        f"| rollout share of step | {fmt(sm['rollout_share'], 2)} |",
        f"| completion tokens | {fmt(sm['completion_tokens'], 0)} |",
        f"| rollout completion tokens/s | {fmt(sm['rollout_tokens_per_s'], 0)} |",
        "",
    ]
    zero = sum(r["reward_mean"] == 0.0 for r in g["per_step"])
    if zero:
        lines += [
            "The untrained toy model rarely answers an arithmetic prompt correctly: the mean "
            f"reward was 0 in {zero} of {g['steps']} steps, where every advantage, the loss and "
            "the gradient are 0. The update still runs every forward and backward, so its time "
            "is representative.",
            "",
        ]
    tw, hf = s["twinrun"], s["hf"]
    ok = s["ratio_tokens_per_s"] >= RATIO_GOAL
    prof = s["twinrun_profile"]["share"]
    lo, hi = min(s["prompt_lengths"]), max(s["prompt_lengths"])
    lengths = f"{lo}" if lo == hi else f"{lo}–{hi}"
    lines += [
        "### Sampling speed: twinrun `generate` vs Hugging Face `generate`",
        "",
        f"Same toy model, same {s['prompts']} arithmetic prompts ({lengths} tokens, "
        "chat template on), one prompt per call, "
        f"{s['new_tokens']} new tokens per call in both (EOS stopping off in both, checked: "
        f"twinrun sampled EOS {s['eos_tokens_emitted_without_stopping']['twinrun']} times, HF "
        f"{s['eos_tokens_emitted_without_stopping']['hf']} times, and both went on), "
        "temperature 1, no top-k / top-p, in one process, alternating which runs first; "
        f"{s['repeats']} repeats. twinrun: `twinrun.model.decoding.generate` (KV cache, "
        "float64 sampling with `twinrun.core.rng.stream` draws, logprobs kept). HF: "
        "`LlamaForCausalLM` (attention `eager`) `.generate(do_sample=True, top_k=0, top_p=1.0, "
        "temperature=1.0)`. Prompt logits of the two agree to "
        f"{s['max_abs_prompt_logit_diff']:.1e}.",
        "",
        "| | twinrun tokens/s | HF tokens/s | twinrun/HF (of medians) | twinrun/HF per repeat "
        "| twinrun/HF per adjacent call pair |",
        "|---|---|---|---|---|---|",
        f"| wall | {fmt(tw['tokens_per_s'], 0)} | {fmt(hf['tokens_per_s'], 0)} "
        f"| **{s['ratio_tokens_per_s']:.2f}×** | {fmt(s['ratio_tokens_per_s_per_repeat'], 2)} "
        f"| {fmt(s['ratio_tokens_per_s_per_call_pair'], 2)} |",
        f"| CPU | {fmt(tw['cpu_tokens_per_s'], 0)} | {fmt(hf['cpu_tokens_per_s'], 0)} "
        f"| {s['ratio_cpu_tokens_per_s']:.2f}× | "
        f"{fmt(s['ratio_cpu_tokens_per_s_per_repeat'], 2)} | – |",
        "",
        f"Goal: twinrun/HF ≥ {RATIO_GOAL:.1f}× (wall, medians) — {benchkit.verdict(ok)}.",
        "",
        "Where twinrun's `generate` spends its time (cProfile over one pass of the prompts; "
        "profiling inflates Python-level overhead): "
        + ", ".join(f"{k} {v:.0%}" for k, v in prof.items())
        + ".",
    ]
    if res["quick"]:
        lines += ["", "Note: a `--quick` smoke run (few steps and repeats)."]
    return "\n".join(lines) + "\n"


def update_docs(body: str) -> None:
    """Replace only this benchmark's section of docs/benchmarks.md; append it if missing."""
    update_docs_section(
        "grpo",
        "GRPO: step time and sampling speed",
        (
            "Per GRPO step, rollout vs update seconds; and twinrun's sampler against Hugging "
            "Face `generate` on the same model and prompts. Generated by `python "
            "bench/grpo.py` (also in `bench/results/grpo.md`); do not edit between the "
            "markers."
        ),
        body,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 steps, 2 repeats, 3 prompts, no files")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default 10; 4 quick)")
    ap.add_argument("--repeats", type=int, default=None, help="generation repeats (default 15)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per repeat (default 8)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens per call (default 32)")
    ap.add_argument("--write", action=argparse.BooleanOptionalAction, default=None)
    args = ap.parse_args()
    args.steps = args.steps or (4 if args.quick else 10)
    args.repeats = args.repeats or (2 if args.quick else 15)
    args.prompts = args.prompts or (3 if args.quick else 8)
    write = (not args.quick) if args.write is None else args.write
    if args.steps < 3:
        ap.error("--steps must be at least 3 (step 0 is a warm-up)")

    started = time.perf_counter()
    loadavg_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="grpo_bench_") as tmp:
        work = Path(tmp)
        model = benchkit.write_toy(work / "toy")
        print(f"  GRPO: {args.steps} steps ...", file=sys.stderr, flush=True)
        grpo = measure_grpo(model, work, args.steps)
        generation = measure_generation(model, args.repeats, args.prompts, args.new_tokens)
    res: dict[str, Any] = {
        "benchmark": "grpo",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "settings": {
            "grpo": GRPO_SETTINGS
            | {"steps": args.steps, "examples": str(EXAMPLES.relative_to(ROOT))},
            "generation": {
                "repeats": args.repeats,
                "prompts": args.prompts,
                "new_tokens": args.new_tokens,
                "threads": 1,
            },
            "model": "twinrun toy-model --seed 0",
        },
        "goals": {"generation_ratio_tokens_per_s_min": RATIO_GOAL},
        "machine": machine(),
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "grpo": grpo,
        "generation": generation,
    }
    res["bench_wall_s"] = round(time.perf_counter() - started, 1)
    res["pass"] = {"generation_ratio": generation["ratio_tokens_per_s"] >= RATIO_GOAL}
    body = markdown(res)
    print(body)
    print(f"bench took {res['bench_wall_s']} s", file=sys.stderr)
    if write:
        benchkit.write_results(
            "grpo", res, "# GRPO: step time and sampling speed vs Hugging Face\n\n" + body
        )
        update_docs(body)
        print(f"wrote {RESULTS / 'grpo.json'}, grpo.md and {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
