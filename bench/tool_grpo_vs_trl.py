"""Benchmark: multi-turn GRPO in a tool environment, twinrun vs TRL 1.16's `environment_factory`,
and what the observation checksums (`--diag`) cost per step.

One environment class, `Calculator` below, in TRL's `environment_factory` shape (`reset(**row)`
returning None, so the row's prompt is the first user message on both sides; one public tool
`calculate(expression: str) -> str` with a Google docstring, evaluated by twinrun's own
`calculator` arithmetic, `twinrun.rl.tool_envs.evaluate`), is used by BOTH: twinrun loads it as
`--env tool_grpo_vs_trl:Calculator` (PYTHONPATH=bench), TRL as `environment_factory=Calculator`.
On both sides a model turn with a `<tool_call>` gets one tool message per call and a turn
without one ends the episode; the reward is 1.0 when the final model turn starts with the
row's integer answer (twinrun's rule for a TRL class without `reward`; TRL gets it as a reward
function).

The same model, rows (`src/twinrun/examples/arith.jsonl`), group size, prompts per step,
tokens per turn and turns per episode, LoRA rank 8 / alpha 16 on q/k/v/o, no KL, lr 1e-3,
temperature 1, no top-k / top-p, one torch thread, the 16 rows of a step in one update forward.

The model. An untrained checkpoint never writes a tool call, so every episode would end after
its first turn on both sides: no multi-turn work to compare. So the script first makes a
*tool caller* of the toy (`twinrun toy-model --seed 0`): a plain PyTorch full fine-tune (AdamW,
all weights, `SFT["toy"]` steps on the whole batch; a LoRA on the random toy did not learn the
80-byte call in minutes) on rows whose assistant turn is the Hermes call
`<tool_call>{"name": "calculate", "arguments": {"expression": "6 * 7"}}</tool_call>` (after the
user question, and again after a tool result), cached in CACHE by its inputs. Both sides train
that checkpoint. It keeps calling, so most episodes run to the turn limit on both sides; the
mean turns and model tokens per episode are reported for each side. `--smollm2` uses
SmolLM2-135M-Instruct (`testkit/smollm2.py`'s cache) as it is, only the template extended
(a fine-tune of it does not fit in CPU minutes; it rarely calls the tool, so its episodes are
mostly one turn).

What TRL needed of the checkpoint, and what was done (the smallest change that lets it run):

- TRL refuses a chat template that does not render an assistant message's `tool_calls`
  (`supports_tool_calling`); neither the toy's nor SmolLM2's does. The tool caller's
  `chat_template.jinja` is the base template with one addition, `tool_calls` rendered as
  `<tool_call>{json}</tool_call>` after the content. twinrun reads the same file; it never
  passes `tool_calls` (its assistant messages hold the model's text), so its rendering is the
  base template's, byte for byte.
- TRL parses each turn with `tokenizer.parse_response` and knows response templates only for
  the templates it ships (Qwen, Llama 3.1, ...). The child sets `tokenizer.response_template`
  to the Hermes parser of TRL's `qwen3_template` (tool calls between `<tool_call>` tags,
  parsed as JSON) with this template's assistant header and end-of-turn token.
- The tool list: twinrun puts `tools_system_text(schemas)` in a system message when the
  template does not render `tools` (SmolLM2's); TRL's dataset prompt gets that same system
  message (the same string), and the template ignores TRL's `tools` argument. The toy's template
  also takes `tools` and renders nothing of them, on both sides (the byte-level toy cannot read
  a 650-byte tool list, which would make every row ten times longer).
- Token budget: TRL's `max_completion_length` caps a whole episode (model and tool tokens) and
  each of its turns may use what is left; twinrun's `--max-new-tokens` caps each turn. TRL gets
  `max_turns x tokens per turn + (max_turns - 1) x TOOL_ROOM`, and
  `max_tool_calling_iterations = max_turns - 1` (it counts the turns after the first); twinrun
  `--max-turns max_turns`. twinrun also runs the tools of an episode's last turn (the episode
  ends after them); TRL does not run them.

Timing: twinrun's step is `wall_s` in metrics.jsonl (twinrun runs with `--diag`, its checksums on;
the turns per episode are read from its diag rows); TRL's is on_step_begin -> on_step_end of a
TrainerCallback (`bench/trl_tool_child.py`, in `bench/.venv-trl`, made by
`grpo_vs_trl.trl_python`). The two alternate process by process (`--rounds`, which goes first
alternating); step 0 of each process is a warm-up, left out. twinrun / TRL is the ratio of the
medians over all timed steps; each round's ratio gives its spread.

Observation checksums: paired twinrun processes on the toy tool caller without and with
`--diag` (order alternating), per-step `wall_s` medians; and, in this process, the time of
`twinrun.train.recipes.grpo.observation_leaves` + `turn_leaves` over a step's 16 rollouts of the
toy's shape (the texts and token counts the tool caller produces: turn 0 the user message, then
tool messages) plus the diag recorder's checksum and digest of those leaves, as
a share of the step.

    python -m bench tool_grpo_vs_trl [--rounds 3] [--steps 5] [--diag-pairs 2] [--smollm2] [--quick]

Writes bench/results/tool_grpo_vs_trl.json, .md and the `tool_grpo_vs_trl` section of
docs/benchmarks.md (`--quick`: 1 round of 3 steps, 1 diag pair, prints only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "arith.jsonl"
CACHE = Path(tempfile.gettempdir()) / "twinrun-tool-bench"
ENV = "tool_grpo_vs_trl:Calculator"
CALL_EXPRESSION = "6 * 7"  # the tool caller's call, the same in every turn
TOKENS = "model_tokens_per_episode"
TOOL_ROOM = 48  # TRL's budget per tool reply (tokens), on top of the model's turns

COMMON = {
    "seed": 1, "prompts_per_step": 4, "group_size": 4, "max_turns": 3, "temperature": 1.0,
    "learning_rate": 1e-3, "lora_rank": 8, "lora_alpha": 16,
}  # fmt: skip
PER_TURN = {"toy": 96, "smollm2": 40}  # max new tokens per model turn (the call is ~81 / ~27)
SFT = {  # making the tool caller: full fine-tuning steps on the 64 rows, AdamW learning rate
    "toy": {"steps": 150, "learning_rate": 3e-3},
    "smollm2": {"steps": 0, "learning_rate": 0.0},  # the instruct model as it is (CPU time)
}


class Calculator:
    """The calculator environment in TRL's `environment_factory` shape (used by both sides)."""

    def __init__(self) -> None:
        self.answer: str | None = None

    def reset(self, **kwargs: Any) -> None:
        """A new episode: the row's prompt is the first user message (None on both sides)."""
        self.answer = str(kwargs.get("answer"))
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 2".
        """
        from twinrun.rl.tool_envs import evaluate

        return str(evaluate(expression))


def tool_call_text(expression: str) -> str:
    call = {"name": "calculate", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def tools_text(kind: str) -> str:
    """twinrun's system text for the class's one tool (what twinrun adds; TRL gets the same);
    "" for the toy, whose template takes `tools` and renders nothing of them."""
    if kind == "toy":
        return ""
    sys.path.insert(0, str(ROOT / "src"))
    from twinrun.rl.tool_calls import tool_schema, tools_system_text

    return tools_system_text([tool_schema(Calculator().calculate, "calculate")])


def with_tool_calls(template: str, kind: str) -> str:
    """The base chat template, an assistant message's `tool_calls` rendered after its content
    (what TRL's `supports_tool_calling` needs; twinrun never passes `tool_calls`); the toy's
    also takes `tools` and renders nothing of them."""
    if kind == "toy":
        template = "{% if tools %}{% endif %}" + template
    extra = (
        "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}"
        "</tool_call>{% endfor %}{% endif %}"
    )
    for content in ("{{ m['content'] }}", "message['content'] + '<|im_end|>'"):
        if content in template:
            if content.startswith("{{"):
                return template.replace(content, content + extra, 1)
            # SmolLM2: '...' + message['content'] + '<|im_end|>' inside one {{ }}
            head, tail = template.split(content, 1)
            extra2 = extra.replace("{% for c in m", "{% for c in message").replace(
                "{% if m.tool", "{% if message.tool"
            )
            return head + "message['content'] }}" + extra2 + "{{ '<|im_end|>'" + tail
    raise SystemExit("unknown chat template: cannot add tool_calls rendering")


def first_messages(system: str, prompt: str) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": prompt}]


def sft_rows(system: str) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in EXAMPLES.read_text().splitlines() if x.strip()]
    out = []
    call = tool_call_text(CALL_EXPRESSION)
    for r in rows:
        base = first_messages(system, r["prompt"])
        out.append({"messages": [*base, {"role": "assistant", "content": call}]})
        out.append({"messages": [*base, {"role": "assistant", "content": call},
                                 {"role": "tool", "content": "42"},
                                 {"role": "assistant", "content": call}]})  # fmt: skip
    return out


def fine_tune(
    base: Path, rows: list[dict[str, Any]], cfg: dict[str, Any]
) -> tuple[Any, list[float]]:
    """Full fine-tuning (AdamW, all weights) of `base` on the rows' last assistant turn (its text
    and the end of turn), the whole batch each step, one thread: a plain PyTorch loop, not
    twinrun (a LoRA on the random toy does not learn an 80-byte string in minutes)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    seqs, starts = [], []
    for r in rows:
        msgs = r["messages"]
        head = tok.apply_chat_template(msgs[:-1], add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(msgs, tokenize=False)
        assert full.startswith(head)
        ids_head = tok(head, add_special_tokens=False)["input_ids"]
        ids = tok(full, add_special_tokens=False)["input_ids"]
        seqs.append(ids)
        starts.append(len(ids_head))
    width = max(len(x) for x in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (x, st) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        labels[i, st : len(x)] = torch.tensor(x[st:])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(cfg["steps"]):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    model.eval()
    return model, losses


def tool_caller(kind: str, base: Path) -> tuple[Path, dict[str, Any]]:
    """The tool-calling checkpoint made from `base` (cached in CACHE by its inputs)."""
    system = tools_text(kind)
    rows = sft_rows(system)
    cfg = SFT[kind]
    weights = hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest()
    template = (base / "chat_template.jinja").read_text()
    key = hashlib.sha256(
        json.dumps([kind, weights, template, rows, cfg], sort_keys=True).encode()
    ).hexdigest()[:12]
    out = CACHE / f"{kind}-caller-{key}"
    info = {"sft_steps": cfg["steps"], "sft_learning_rate": cfg["learning_rate"],
            "sft_rows": len(rows), "checkpoint": str(out)}  # fmt: skip
    if (out / "done").exists():
        info |= json.loads((out / "done").read_text())
        return out, info
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tmp = out.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if cfg["steps"]:
        model, losses = fine_tune(base, rows, cfg)
        model.save_pretrained(tmp, safe_serialization=True)
    else:  # the base weights as they are (only the template changes)
        tmp.mkdir(parents=True)
        losses = [float("nan")]
        for name in ("config.json", "generation_config.json"):
            if (base / name).exists():
                shutil.copy(base / name, tmp / name)
        (tmp / "model.safetensors").symlink_to((base / "model.safetensors").resolve())
    for f in base.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, tmp / f.name)
    template = with_tool_calls((base / "chat_template.jinja").read_text(), kind)
    (tmp / "chat_template.jinja").write_text(template)
    made = {"sft_s": round(time.perf_counter() - t0, 1), "sft_first_loss": losses[0],
            "sft_last_loss": losses[-1]}  # fmt: skip
    (tmp / "done").write_text(json.dumps(made))
    tmp.rename(out)
    return out, info | made


def settings(kind: str) -> dict[str, Any]:
    per_turn, turns = PER_TURN[kind], COMMON["max_turns"]
    return {**COMMON, "max_new_tokens_per_turn": per_turn,
            "trl_max_completion_length": turns * per_turn + (turns - 1) * TOOL_ROOM,
            "trl_max_tool_calling_iterations": turns - 1}  # fmt: skip


def diag_turns(path: Path) -> list[float]:
    """Mean turns per episode of each diag row (the `observation...sample_K.turn_T` leaves)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        keys = [k for k in json.loads(line)["checksums"] if k.startswith("observation.prompt_")]
        episodes = {k.rsplit(".turn_", 1)[0] for k in keys}
        out.append(len(keys) / len(episodes))
    return out


def twinrun_steps(model: Path, work: Path, kind: str, steps: int, diag: bool) -> dict[str, Any]:
    s, out = settings(kind), work / f"tw-{time.monotonic_ns()}"
    rows = s["prompts_per_step"] * s["group_size"]
    cmd = [
        sys.executable, "-m", "twinrun", "tune", "grpo", "--model", str(model),
        "--examples", str(EXAMPLES), "--output", str(out), "--seed", str(s["seed"]),
        "--steps", str(steps), "--prompts-per-step", str(s["prompts_per_step"]),
        "--group-size", str(s["group_size"]), "--max-new-tokens", str(s["max_new_tokens_per_turn"]),
        "--temperature", str(s["temperature"]), "--batch-size", str(rows), "--clip-eps", "0.2",
        "--advantage-clip", "5", "--token-cap", str(s["trl_max_completion_length"]),
        "--learning-rate", str(s["learning_rate"]), "--warmup-steps", "0",
        "--lr-schedule", "constant", "--lora-rank", str(s["lora_rank"]),
        "--lora-alpha", str(s["lora_alpha"]), "--precision", "f32", "--chat-template", "on",
        "--env", ENV, "--max-turns", str(s["max_turns"]), "--tool-timeout", "30",
        "--threads", "1", "--quiet", *(["--diag"] if diag else []),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"twinrun failed:\n{proc.stderr[-3000:]}")
    got = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    res = {
        "step_s": [r["wall_s"] for r in got],
        "rollout_s": [r["rollout_s"] for r in got],
        "update_s": [r["update_s"] for r in got],
        "model_tokens_per_episode": [r["active_tokens"] / rows for r in got],
        "reward_mean": [r["reward_mean"] for r in got],
    }
    if diag:
        res["turns_per_episode"] = diag_turns(out / "diag.jsonl")
    shutil.rmtree(out, ignore_errors=True)
    return res


def trl_steps(py: Path, model: Path, work: Path, kind: str, steps: int) -> dict[str, Any]:
    tag = time.monotonic_ns()
    s = {**settings(kind), "model": str(model), "examples": str(EXAMPLES), "steps": steps,
         "output": str(work / f"trl-{tag}"), "system": tools_text(kind), "kind": kind}  # fmt: skip
    sfile, ofile = work / f"trl-{tag}.json", work / f"trl-{tag}.out.json"
    sfile.write_text(json.dumps(s), encoding="utf-8")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TQDM_DISABLE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    proc = subprocess.run(
        [str(py), str(BENCH / "trl_tool_child.py"), str(sfile), str(ofile)],
        cwd=ROOT, capture_output=True, text=True, env=env,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"TRL failed:\n{proc.stderr[-4000:]}")
    got = json.loads(ofile.read_text())
    shutil.rmtree(work / f"trl-{tag}", ignore_errors=True)
    return got


def flat(runs: list[dict[str, Any]], who: str, key: str, skip: int = 1) -> list[float]:
    return [x for run in runs for x in run[who][key][skip:] if x is not None]


def compare(
    py: Path, model: Path, work: Path, kind: str, rounds: int, steps: int
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        order = ("twinrun", "trl") if r % 2 == 0 else ("trl", "twinrun")
        got = {}
        for who in order:
            got[who] = (twinrun_steps(model, work, kind, steps, diag=True) if who == "twinrun"
                        else trl_steps(py, model, work, kind, steps))  # fmt: skip
            print(
                f"  {kind} round {r} {who}: {[round(x, 3) for x in got[who]['step_s']]}", flush=True
            )
        runs.append({"order": order, **got})
    tw, trl = flat(runs, "twinrun", "step_s"), flat(runs, "trl", "step_s")
    per_round = [statistics.median(run["twinrun"]["step_s"][1:])
                 / statistics.median(run["trl"]["step_s"][1:]) for run in runs]  # fmt: skip
    import benchkit

    return {
        "rounds": runs,
        "twinrun_step_s": benchkit.spread(tw, 4),
        "twinrun_rollout_s": benchkit.spread(flat(runs, "twinrun", "rollout_s"), 4),
        "twinrun_update_s": benchkit.spread(flat(runs, "twinrun", "update_s"), 4),
        "trl_step_s": benchkit.spread(trl, 4),
        "ratio": statistics.median(tw) / statistics.median(trl),
        "ratio_per_model_token": (
            statistics.median(tw) / statistics.mean(flat(runs, "twinrun", TOKENS, 0))
        ) / (statistics.median(trl) / statistics.mean(flat(runs, "trl", TOKENS, 0))),
        "ratio_per_round": benchkit.spread(per_round, 3),
        "twinrun_turns_per_episode": statistics.mean(flat(runs, "twinrun", "turns_per_episode", 0)),
        "trl_turns_per_episode": statistics.mean(flat(runs, "trl", "turns_per_episode", 0)),
        "twinrun_model_tokens_per_episode": statistics.mean(
            flat(runs, "twinrun", "model_tokens_per_episode", 0)),
        "trl_model_tokens_per_episode": statistics.mean(
            flat(runs, "trl", "model_tokens_per_episode", 0)),
        "trl_tokens_per_episode": statistics.mean(flat(runs, "trl", "tokens_per_episode", 0)),
        "twinrun_reward_mean": statistics.mean(flat(runs, "twinrun", "reward_mean", 0)),
        "trl_reward_mean": statistics.mean(flat(runs, "trl", "reward_mean", 0)),
    }  # fmt: skip


def diag_pairs(model: Path, work: Path, pairs: int, steps: int) -> dict[str, Any]:
    """Paired twinrun processes without / with --diag, order alternating."""
    import benchkit

    off: list[list[float]] = []
    on: list[list[float]] = []
    for p in range(pairs):
        for diag in (False, True) if p % 2 == 0 else (True, False):
            got = twinrun_steps(model, work, "toy", steps, diag)["step_s"][1:]
            (on if diag else off).append(got)
            print(f"  diag pair {p} diag={diag}: {[round(x, 3) for x in got]}", flush=True)
    per_pair = [
        statistics.median(b) / statistics.median(a) - 1 for a, b in zip(off, on, strict=True)
    ]
    moff = statistics.median([x for r in off for x in r])
    mon = statistics.median([x for r in on for x in r])
    return {"pairs": pairs, "steps_per_process": steps,
            "off_step_s": benchkit.spread([x for r in off for x in r], 4),
            "on_step_s": benchkit.spread([x for r in on for x in r], 4),
            "overhead": mon / moff - 1,
            "overhead_per_pair": benchkit.spread(per_pair, 4)}  # fmt: skip


def leaf_cost(model: Path, turns: int, repeats: int = 21) -> dict[str, Any]:
    """Time of observation_leaves + turn_leaves, and of the diag recorder's checksum + digest of
    those leaves, over one step's 16 rollouts shaped as the toy tool caller's (every episode
    `turns` turns of one call each; texts and token ids from the real template and tokenizer)."""
    sys.path.insert(0, str(ROOT / "src"))
    from twinrun.diag.recorder import StepRecord
    from twinrun.model.tokens import load_tokenizer
    from twinrun.rl.tool_calls import canonical_json
    from twinrun.train.recipes.grpo import Rollout, observation_leaves, turn_leaves

    tok = load_tokenizer(model)
    s = settings("toy")
    rows = [json.loads(x) for x in EXAMPLES.read_text().splitlines()[: s["prompts_per_step"]]]
    fresh = []
    call = tool_call_text(CALL_EXPRESSION)
    for e, r in enumerate(rows):
        for k in range(s["group_size"]):
            msgs = first_messages(tools_text("toy"), r["prompt"])
            text = str(tok.render_chat(msgs, True, None))
            first = tok.encode(text)
            tlist, completion, mask = [], [], []
            pending = first
            observation = canonical_json(msgs)
            for t in range(turns):
                sampled = tok.encode(call) + [tok.end_ids[0]]
                tlist.append({"observation": observation, "prompt": pending, "sampled": sampled})
                completion += sampled
                mask += [1] * len(sampled)
                if t + 1 < turns:
                    reply = [{"role": "tool", "content": "42"}]
                    observation = canonical_json(reply)
                    pending = (
                        tok.encode("<|tool|>\n42")
                        + [tok.end_ids[0]]
                        + tok.encode("<|assistant|>\n")
                    )
                    completion += pending
                    mask += [0] * len(pending)
            ro = Rollout(e, k, 0, first, completion, [0.0] * len(completion), 0.0)
            ro.model_mask, ro.turns = mask, tlist
            fresh.append(ro)
    build, record = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        leaves = observation_leaves(fresh, s["group_size"]) | turn_leaves(fresh)
        t1 = time.perf_counter()
        rec = StepRecord(0)
        for name, value in leaves.items():
            rec.add(name, value)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        record.append(t2 - t1)
    n_obs = sum(1 for k in leaves if k.startswith("observation."))
    return {"rollouts": len(fresh), "turns_per_episode": turns, "observation_leaves": n_obs,
            "turn_tokens": sum(len(t["prompt"]) + len(t["sampled"])
                               for r in fresh for t in r.turns or []),
            "build_s": statistics.median(build), "record_s": statistics.median(record),
            "repeats": repeats}  # fmt: skip


def fmt(s: dict[str, Any], d: int = 3) -> str:
    return f"{s['median']:.{d}f} ({s['min']:.{d}f}–{s['max']:.{d}f})"


def table(name: str, c: dict[str, Any], s: dict[str, Any], made: dict[str, Any]) -> list[str]:
    return [
        f"### {name}", "",
        (f"Tool caller: the base checkpoint fully fine-tuned (AdamW) on {made['sft_rows']} rows "
         f"for {made['sft_steps']} steps, loss {made['sft_first_loss']:.3f} → "
         f"{made['sft_last_loss']:.4f}; " if made["sft_steps"] else
         "The base weights as they are (only the chat template extended); ")
        + "≤ "
        f"{s['max_new_tokens_per_turn']} new tokens per turn, ≤ {s['max_turns']} turns (TRL: "
        f"`max_completion_length` {s['trl_max_completion_length']}, `max_tool_calling_iterations` "
        f"{s['trl_max_tool_calling_iterations']}).", "",
        "| per step (s) | median (min–max) |", "|---|---|",
        f"| twinrun step | {fmt(c['twinrun_step_s'])} |",
        f"| — rollout (every turn, tools, rewards) | {fmt(c['twinrun_rollout_s'])} |",
        f"| — update | {fmt(c['twinrun_update_s'])} |",
        f"| TRL GRPOTrainer (`environment_factory`) step | {fmt(c['trl_step_s'])} |",
        f"| **twinrun / TRL** | **{c['ratio']:.2f}×** (per round {fmt(c['ratio_per_round'], 2)}) |",
        f"| twinrun / TRL per model token (step s ÷ mean model tokens per episode) | "
        f"{c['ratio_per_model_token']:.2f}× |",
        "",
        "| per episode (mean over all steps) | twinrun | TRL |", "|---|---|---|",
        f"| model turns | {c['twinrun_turns_per_episode']:.2f} | "
        f"{c['trl_turns_per_episode']:.2f} |",
        f"| model tokens (in the loss) | {c['twinrun_model_tokens_per_episode']:.1f} | "
        f"{c['trl_model_tokens_per_episode']:.1f} |",
        f"| all tokens after the prompt (model + tool) | – | {c['trl_tokens_per_episode']:.1f} |",
        f"| reward | {c['twinrun_reward_mean']:.3f} | {c['trl_reward_mean']:.3f} |", "",
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--diag-pairs", type=int, default=2)
    ap.add_argument("--smollm2", action="store_true")
    ap.add_argument("--smollm2-rounds", type=int, default=1)
    ap.add_argument("--smollm2-steps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    rounds, steps, pairs = (1, 3, 1) if a.quick else (a.rounds, a.steps, a.diag_pairs)
    sys.path.insert(0, str(BENCH))
    from benchkit import (
        cpu_name,
        git,
        package_versions,
        smollm2_dir,
        update_docs_section,
        write_toy,
    )
    from grpo_vs_trl import TRL_VERSION, trl_python

    py = trl_python()
    load0 = os.getloadavg()[0]
    commit0, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--", "src")
    t_start = time.perf_counter()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        toy_base = write_toy(work / "toy")
        toy, made = tool_caller("toy", toy_base)
        result["toy"] = {"tool_caller": made, "settings": settings("toy"),
                         **compare(py, toy, work, "toy", rounds, steps)}  # fmt: skip
        result["diag"] = diag_pairs(toy, work, pairs, steps)
        result["diag"]["leaf_cost"] = leaf_cost(toy, COMMON["max_turns"])
        if a.smollm2:
            sm, made = tool_caller("smollm2", smollm2_dir())
            r2, s2 = (1, 3) if a.quick else (a.smollm2_rounds, a.smollm2_steps)
            result["smollm2"] = {"tool_caller": made, "settings": settings("smollm2"),
                                 **compare(py, sm, work, "smollm2", r2, s2)}  # fmt: skip
            result["smollm2"]["rounds_run"], result["smollm2"]["steps_per_process"] = r2, s2
    cmd = "python -m bench tool_grpo_vs_trl" + (" --smollm2" if a.smollm2 else "")
    if not a.quick and (a.rounds, a.steps, a.diag_pairs) != (3, 5, 2):
        cmd += f" --rounds {a.rounds} --steps {a.steps} --diag-pairs {a.diag_pairs}"
    if a.smollm2 and (a.smollm2_rounds, a.smollm2_steps) != (1, 3):
        cmd += f" --smollm2-rounds {a.smollm2_rounds} --smollm2-steps {a.smollm2_steps}"
    meta = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": cmd,
        "cpu": cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        **package_versions("torch", "transformers", "peft"), "trl": TRL_VERSION,
        "git_commit": commit0, "src_uncommitted": bool(dirty),
        "git_commit_at_end": git("rev-parse", "--short", "HEAD"),
        "load_avg_start": load0, "load_avg_end": os.getloadavg()[0],
        "rounds": rounds, "steps_per_process": steps,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }  # fmt: skip
    commit = meta["git_commit"] + (" + uncommitted changes in src/" if dirty else "")
    if meta["git_commit_at_end"] != commit0:
        commit += f" at the start, {meta['git_commit_at_end']} at the end"
    lines = [
        f"Measured {meta['when']} by `{cmd}` on {meta['cpu_count']} CPUs ({meta['cpu']}), torch "
        f"{meta['torch']}, transformers {meta['transformers']}, peft {meta['peft']}, TRL "
        f"{TRL_VERSION} (in `bench/.venv-trl` only), commit {commit}; load average {load0:.2f} at "
        f"start, {meta['load_avg_end']:.2f} at end (a shared machine). One environment class in "
        "TRL's `environment_factory` shape (`calculate(expression)`) for both: twinrun "
        f"`--env {ENV}`, TRL `environment_factory=Calculator`; the shipped arithmetic rows, "
        f"{COMMON['prompts_per_step']} prompts × group {COMMON['group_size']} = 16 episodes a "
        "step, temperature 1, LoRA rank 8 on q/k/v/o, no KL, one thread, f32. The model is a "
        "*tool caller* (the base checkpoint fully fine-tuned on Hermes `<tool_call>` turns) so "
        "that episodes are multi-turn on both sides. twinrun runs with `--diag` (its checksums "
        "on, as in a reproducible run; the last section says what they cost). Figures are median "
        "(min–max) over every step but each process's step 0.", "",
    ]  # fmt: skip
    toy_name = f"Toy model (4 layers, hidden 64; {rounds} round(s) × {steps} steps per process)"
    lines += table(toy_name, result["toy"], result["toy"]["settings"], result["toy"]["tool_caller"])
    if "smollm2" in result:
        sm = result["smollm2"]
        lines += table(f"SmolLM2-135M-Instruct ({sm['rounds_run']} round(s) × "
                       f"{sm['steps_per_process']} steps per process)",
                       sm, sm["settings"], sm["tool_caller"])  # fmt: skip
    else:
        lines += [
            "SmolLM2-135M-Instruct: not measured in this run (`--smollm2` not given; see "
            "bench/README.md for why).", "",
        ]  # fmt: skip
    d, lc = result["diag"], result["diag"]["leaf_cost"]
    step = d["off_step_s"]["median"]
    part = lc["build_s"] + lc["record_s"]
    lines += [
        "### Observation checksums: `--diag` on the toy tool caller", "",
        f"{d['pairs']} pair(s) of fresh `twinrun tune grpo` processes (the toy run above), without "
        f"and with `--diag`, order alternating, {d['steps_per_process']} steps each, step 0 left "
        "out; per-step `wall_s`.", "",
        "| per step | without `--diag` | with `--diag` | overhead (medians) | per pair |",
        "|---|---|---|---|---|",
        f"| wall s | {fmt(d['off_step_s'])} | {fmt(d['on_step_s'])} | "
        f"**{100 * d['overhead']:+.1f}%** | {100 * d['overhead_per_pair']['median']:+.1f}% "
        f"({100 * d['overhead_per_pair']['min']:+.1f}% – "
        f"{100 * d['overhead_per_pair']['max']:+.1f}%) |",
        "",
        f"The observation leaves alone, in this process (median of {lc['repeats']}): one step's "
        f"{lc['rollouts']} rollouts of {lc['turns_per_episode']} turns each as the toy tool caller "
        f"writes them ({lc['observation_leaves']} `observation.prompt_G.sample_K.turn_T` leaves, "
        f"{lc['turn_tokens']} turn tokens):", "",
        "| part | ms per step | share of a step without `--diag` |", "|---|---|---|",
        f"| `observation_leaves` + `turn_leaves` (SHA256 of each turn's messages, token tensors; "
        f"built every step, `--diag` or not) | {1e3 * lc['build_s']:.2f} | "
        f"{100 * lc['build_s'] / step:.2f}% |",
        f"| the diag row's checksum + digest of those leaves (`--diag` only) | "
        f"{1e3 * lc['record_s']:.2f} | {100 * lc['record_s'] / step:.2f}% |",
        f"| **together** | **{1e3 * part:.2f}** | **{100 * part / step:.2f}%** |", "",
        "The rest of `--diag`'s cost is the other leaves of the row (the update's logits, the LoRA "
        "gradients, Adam moments and parameters, as in the SFT diag benchmark) and the writing.",
        "",
    ]  # fmt: skip
    md = "\n".join(lines)
    print(md)
    if a.quick:
        return
    benchkit.write_results(
        "tool_grpo_vs_trl",
        {"meta": meta, **result},
        "# Multi-turn GRPO in a tool environment: twinrun vs TRL\n\n" + md + "\n",
    )
    intro = (
        "Multi-turn GRPO with a calculator tool: twinrun and TRL's GRPOTrainer "
        "(`environment_factory`) on the same environment class, model and settings, and what the "
        "observation checksums cost (`python -m bench tool_grpo_vs_trl`; TRL only in "
        "`bench/.venv-trl`; also in `bench/results/tool_grpo_vs_trl.md`); do not edit between "
        "the markers."
    )
    update_docs_section("tool_grpo_vs_trl", "Multi-turn GRPO: twinrun vs TRL environment_factory",
                        intro, md)  # fmt: skip


if __name__ == "__main__":
    main()
