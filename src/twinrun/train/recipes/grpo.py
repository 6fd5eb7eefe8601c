"""`twinrun tune grpo`: GRPO on an environment, with an optional prioritized replay buffer.

One optimizer step:
1. pick `prompts_per_step` example rows (keyed per-epoch shuffle, as SFT);
2. the environment turns each row into an observation (`stream(seed, "env", step, slot)`);
3. sample `group_size` completions per prompt from the current policy, `rollout_block`
   consecutive prompt groups decoded as one batch from one left-padded prefill
   (`model/decoding.py` states what a row's bytes depend on: its prompt, its own draws and its
   block — the block's prompt lengths and size), each token drawn from
   `stream(seed, "sample", step, example_index, k, position)` — a completion never depends on
   the prompts of other blocks, nor on the process count — keeping float64 old logprobs;
4. rewards from the environment; advantages group-normalised, batch-normalised, clipped
   (`rl/advantages.py`); with `--replay per`, earlier rollouts re-enter with probability
   proportional to |advantage|^alpha and importance weights (`rl/prioritized.py`);
5. the token cap keeps at most `token_cap` completion tokens per row; the PPO-clip surrogate
   (`objectives/grpo.py`) is summed over kept tokens and divided by their count, in forwards of
   `batch_size` rows; then one AdamW step.

Steps 1 to 4 are the loop's `collect` phase (`GrpoRecipe.collect` -> `GrpoBatch`), run once per
step; step 5 is `forwards`, which reads only that batch — a spike rerun of the step trains on it
again and never samples or calls the environment a second time.

With `--lora-dropout P` the update's forwards train with LoRA dropout, as TRL's GRPO update
does, each row's masks keyed by its index in the update batch (`recipes.base.dropout_for`). The
old log-probs stay the sampling policy's, drawn without dropout (twinrun samples with the
adapter as it is, and never recomputes them), so the ratio compares the dropped-out policy with
the policy that sampled; the KL reference (`--kl-beta`) is the base with the adapter off, which
no dropout touches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from twinrun.capture.batch import OptimizerBatch, UpdateColumns
from twinrun.config.resolved import (
    Examples,
    PerReplay,
    PolicyUpdate,
    Rollouts,
    StepCount,
    ValidRun,
)
from twinrun.core.errors import ContractError
from twinrun.core.rng import stream
from twinrun.data.batching import epoch_order
from twinrun.data.examples import SourcedRow, conversational_prompt
from twinrun.model.head_chunks import by_chunks, chunks_head, whole_logits
from twinrun.model.lora import lora_disabled
from twinrun.objectives.grpo import grpo_loss
from twinrun.objectives.grpo_logprobs import kept_at, picked_rows, rows_logprobs
from twinrun.rl.advantages import apply_token_cap, compute_advantages
from twinrun.rl.env_protocol import Environment, EnvironmentPluginError
from twinrun.rl.environments import open_environment
from twinrun.rl.prioritized import PrioritizedReplay
from twinrun.rl.tool_settings import check_tool_run
from twinrun.train.hooks.checkpoint import ObjectiveState
from twinrun.train.parallel.distributed import in_global_order, is_root, mine
from twinrun.train.parallel.sharding import forward_slots, paced
from twinrun.train.recipes.base import Recipe, Rows, dropout_for
from twinrun.train.recipes.episodes import check_tool_template, episode_block
from twinrun.train.recipes.transcripts import COMPLETIONS, TranscriptLog
from twinrun.train.setup.session import ModelSession, Session
from twinrun.train.step.faults import unseeded_plans
from twinrun.train.step.loop import Forward, StepForwards, StepOutcome

if TYPE_CHECKING:
    from twinrun.model.tokens import CheckpointTokenizer


@dataclass
class Rollout:
    """One sampled completion and what the update needs of it."""

    example: int
    k: int
    step: int
    prompt_ids: list[int]
    completion: list[int]
    old_logprobs: list[float]  # float64, one per completion token
    reward: float
    advantage: float = 0.0
    weight: float = 1.0  # importance weight when replayed
    # tool environments: 1 on the model's sampled tokens of `completion` (0 on tool and
    # environment tokens, which are in the row but not in the loss); None: every token is the
    # model's (single-turn)
    model_mask: list[int] | None = None
    turns: list[dict[str, Any]] | None = None  # tool environments: each turn (observation leaves)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.completion

    def completion_mask(self) -> list[int]:
        """1 on the completion tokens that are the model's."""
        return model_tokens(self.completion, self.model_mask)

    def update_row(self) -> UpdateRow:
        """What the update reads of this rollout."""
        return UpdateRow(
            self.prompt_ids, self.completion, self.old_logprobs, self.advantage, self.weight,
            self.model_mask,
        )  # fmt: skip


def model_tokens(completion: list[int], model_mask: list[int] | None) -> list[int]:
    """1 on the completion tokens that are the model's (all of them without a model mask)."""
    return model_mask if model_mask is not None else [1] * len(completion)


@dataclass(frozen=True)
class UpdateRow:
    """One row of a GRPO update, and all the update reads of it: its prompt and completion
    tokens, the sampling policy's float64 logprob of each completion token, its advantage and
    importance weight, and (tool environments) the model mask of its completion (None: every
    completion token is the model's). A training step's rows come from its rollouts
    (`Rollout.update_row`), a replay's from the captured batch (`rows_from_batch`)."""

    prompt_ids: list[int]
    completion: list[int]
    old_logprobs: list[float]
    advantage: float
    weight: float
    model_mask: list[int] | None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.completion

    def completion_mask(self) -> list[int]:
        """1 on the completion tokens that are the model's."""
        return model_tokens(self.completion, self.model_mask)


@dataclass
class GrpoState:
    rows: list[SourcedRow]
    env: Environment  # single-turn or a tool environment, as its `plan` says
    env_name: str
    replay: PrioritizedReplay[Rollout] | None
    orders: dict[int, list[int]] = field(default_factory=dict)

    def replay_state(self) -> dict[str, Any]:
        if self.replay is None:
            return {}
        st = self.replay.state_dict()
        return st | {"items": [dataclasses.asdict(r) for r in st["items"]]}

    def set_replay_state(self, st: dict[str, Any]) -> None:
        if self.replay is not None and st:
            items = [Rollout(**r) for r in st["items"]]
            self.replay = PrioritizedReplay.from_state_dict(st | {"items": items})

    def example_at(self, seed: int, position: int) -> int:
        epoch, j = divmod(position, len(self.rows))
        if epoch not in self.orders:
            self.orders = {epoch: epoch_order(seed, epoch, len(self.rows))}
        return self.orders[epoch][j]


@dataclass(frozen=True)
class GrpoBatch:
    """A GRPO step's collected batch: the example of each prompt group, the fresh rollouts
    (group after group, with their rewards and advantages), the update's rows (the fresh
    rollouts', then the replayed ones' with their importance weights) and the replay draws'
    leaves, the rewards [groups, group_size] and advantages, the fraction of groups with no
    signal, and the seconds collecting took."""

    examples: list[int]
    fresh: list[Rollout]
    rows: list[UpdateRow]
    rewards: torch.Tensor
    advantages: torch.Tensor
    zero_fraction: float
    replay_leaves: dict[str, Any]
    rollout_s: float


class NoSignalWarning(UserWarning):
    """A GRPO step whose rewards are equal within every group: its update changes nothing."""


def replay_pending(state: GrpoState) -> bool:
    """Whether replayed rollouts (which carry their own advantages) may still train the step."""
    return state.replay is not None and len(state.replay) > 0


@dataclass
class GrpoRecipe(Recipe):
    """GRPO: each step's prompts, their sampled rollouts scored by the environment, then the
    clipped policy update."""

    name: ClassVar[str] = "grpo"
    s: Session
    state: GrpoState
    plans: list[list[int]]  # the example indices of each step
    warned_no_signal: bool = False
    fresh: list[Rollout] = field(default_factory=list)  # the last collected step's rollouts
    transcripts: TranscriptLog | None = None  # --log-completions (the first process only)

    @classmethod
    def context(cls, run: ValidRun) -> tuple[str, Environment]:
        """The environment is built (and a plugin's errors raised) before anything is written."""
        return run.record(Rollouts).env, run_environment(run)

    @classmethod
    def encode(
        cls, run: ValidRun, tok: CheckpointTokenizer, raw: Any, max_length: int, context: Any
    ) -> list[Any]:
        """Every prompt checked by the environment before the output directory is made."""
        _, env = context
        templated = run.record(Examples).templated
        rows = [conversational_prompt(r, templated) for r in raw]
        env.check_rows(rows, run.seed)
        return usable_prompts(tok, rows, run, env.plan.tool_turns)

    @classmethod
    def open(cls, session: Session, encoded: list[Any], context: Any) -> GrpoRecipe:
        name, env = context
        run = session.run  # as the session resolved it (the device under torchrun)
        replay: PrioritizedReplay[Any] | None = None
        if run.has(PerReplay):
            per = run.record(PerReplay)
            replay = PrioritizedReplay(per.replay_capacity, per.replay_alpha, per.replay_beta)
        state = GrpoState(rows=encoded, env=env, env_name=name, replay=replay)
        p, steps = run.record(Rollouts).prompts_per_step, run.record(StepCount).steps
        seed = run.seed
        plans = [[state.example_at(seed, step * p + i) for i in range(p)] for step in range(steps)]
        recipe = cls(session, state, unseeded_plans(session.faults, plans, len(encoded)))
        recipe.objective_state = ObjectiveState(state.replay_state, state.set_replay_state)
        logged = run.sampling.log_completions
        if logged and is_root():
            recipe.transcripts = TranscriptLog(session.out / COMPLETIONS, logged, session.tok)
        return recipe

    @classmethod
    def replay_forwards(cls, s: ModelSession, batch: OptimizerBatch, step: int) -> StepForwards:
        return update_forwards(s, rows_from_batch(batch), step)

    def summary(self, metrics: Rows, spikes: Rows) -> dict[str, Any]:
        return {
            "final_loss": metrics[-1]["loss"],
            "spikes": spikes,
            "steps": self.total_steps,
            "final_reward_mean": metrics[-1]["reward_mean"],
        }

    def prepare(self, step: int) -> list[int]:
        return self.plans[step]

    def collect(self, step: int, examples: list[int]) -> GrpoBatch:
        """Rollouts from the current policy (the environment's turns included), their rewards
        and advantages, and the replayed rollouts: everything the update reads, made once."""
        s, state, rollouts = self.s, self.state, self.s.run.record(Rollouts)
        t0 = time.perf_counter()
        fresh = sampled_rollouts(s, state, step, examples)
        rewards = torch.tensor([r.reward for r in fresh], dtype=torch.float64).view(
            len(examples), rollouts.group_size
        )
        check_rewards(state.env_name, step, rewards)  # before any advantage or update
        advantages, zero_frac = compute_advantages(rewards, rollouts.advantage_clip)
        if zero_frac == 1.0 and not self.warned_no_signal and not replay_pending(state):
            self.warned_no_signal = True
            warnings.warn(
                f"step {step}: every prompt group's rewards are equal, so every advantage is 0 "
                "and the update is a no-op (loss 0); the environment gives no signal yet — "
                "check its reward on the model's answers (said once per run)",
                NoSignalWarning,
                stacklevel=2,
            )
        for r, adv in zip(fresh, advantages.reshape(-1).tolist(), strict=True):
            r.advantage = adv
        replayed, replay_leaves = replay_draws(s, state, step)
        self.fresh = fresh
        return GrpoBatch(
            examples, fresh, [r.update_row() for r in fresh + replayed], rewards, advantages,
            zero_frac, replay_leaves, rollout_s=time.perf_counter() - t0,
        )  # fmt: skip

    def forwards(self, step: int, batch: GrpoBatch) -> StepForwards:
        """The update's forwards over the collected rollouts (fresh, then replayed); nothing is
        sampled here, so a rerun of the step trains on the same batch."""
        state, group = self.state, self.s.run.record(Rollouts).group_size
        t1 = time.perf_counter()
        fresh, rewards, advantages = batch.fresh, batch.rewards, batch.advantages
        update = yield from update_forwards(self.s, batch.rows, step)
        leaves: dict[str, Any] = {
            "batch.sample_indices": torch.tensor(batch.examples, dtype=torch.int64)
        }
        leaves |= observation_leaves(fresh, group)
        leaves |= turn_leaves(fresh)
        if state.replay is not None:
            leaves |= batch.replay_leaves
        leaves |= {
            "rollout.tokens": [torch.tensor(r.tokens, dtype=torch.int64) for r in fresh],
            "rollout.rewards": rewards,
            "rollout.advantages": advantages,
            "rollout.old_logprobs": torch.tensor(
                [x for r in fresh for x in r.old_logprobs], dtype=torch.float64
            ),
        }
        update.leaves = leaves
        update.metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "zero_advantage_group_fraction": batch.zero_fraction,
            "active_tokens": update.tokens,
            "clip_fraction": update.metrics["clip_fraction"],
            "replayed_rows": len(batch.rows) - len(fresh),
            "rollout_s": batch.rollout_s,
            "update_s": time.perf_counter() - t1,
        }
        check_step_numbers(state.env_name, step, advantages, update.metrics)
        return update

    def after_update(self, step: int, outcome: StepOutcome) -> None:
        if self.state.replay is not None:
            remember(self.state, self.fresh)
        if self.transcripts is not None:
            self.transcripts.write(self.fresh)


REWARD_LIMIT = 1e9  # |reward| above this is refused: its mean and population std stay finite


def check_rewards(env_name: str, step: int, rewards: torch.Tensor) -> None:
    """EnvironmentPluginError naming the environment and the value unless every reward of the
    step is finite and |reward| <= REWARD_LIMIT (±1e308 would make reward_std inf and every
    advantage 0: a silent no-op step)."""
    for value in rewards.reshape(-1).tolist():
        if not math.isfinite(value) or abs(value) > REWARD_LIMIT:
            raise EnvironmentPluginError(
                f"environment {env_name!r}: step {step}: reward {value!r} is past the bound "
                f"|reward| <= {REWARD_LIMIT:g}",
                "return rewards of a sane size (scale them down)",
            )


def check_step_numbers(
    env_name: str, step: int, advantages: torch.Tensor, metrics: dict[str, Any]
) -> None:
    """EnvironmentPluginError unless the step's advantages and every metric are finite."""
    for value in advantages.reshape(-1).tolist():
        if not math.isfinite(value):
            raise EnvironmentPluginError(
                f"environment {env_name!r}: step {step}: an advantage is {value!r}, not finite"
            )
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise EnvironmentPluginError(
                f"environment {env_name!r}: step {step}: metric {key} is {value!r}, not finite"
            )


def run_environment(run: ValidRun) -> Environment:
    """The run's environment, opened once (`open_environment` checks `--max-turns` and
    `--tool-timeout` against its kind), and the rest of a tool environment's run checked."""
    name, sampling = run.record(Rollouts).env, run.sampling
    env = open_environment(
        name, sampling.env_args, max_turns=sampling.max_turns, timeout_s=sampling.tool_timeout
    )
    if env.plan.tool_turns:
        check_tool_run(
            env=name, chat_template=run.record(Examples).chat_template, inject=run.switches.inject
        )
    return env


def usable_prompts(
    tok: Any, rows: list[SourcedRow], run: ValidRun, tools: bool = False
) -> list[SourcedRow]:
    """The rows, once the tokenizer is known to encode prompts the way the run asks (prompts are
    encoded step by step, so a missing chat template must fail before anything is written); a
    tool environment also needs a template that renders tool messages."""
    if run.record(Examples).templated:
        tok.require_chat_template()
    if tools:
        check_tool_template(tok)
    return rows


def rollout_blocks(groups: int, block: int) -> list[range]:
    """The step's prompt groups in blocks of `block` consecutive global group indices (the last
    may be shorter): fixed by the run's settings, never by the process count."""
    return [range(a, min(groups, a + block)) for a in range(0, groups, block)]


def sampled_rollouts(s: Session, state: GrpoState, step: int, examples: list[int]) -> list[Rollout]:
    """Every prompt group's rollouts, in global group order. The groups are decoded in blocks of
    `rollout_block` (`rollout_blocks`); under torchrun block b is sampled by process
    b % world (draws are keyed by example and k, and a block is the same on any process, so a
    completion does not depend on the process that samples it) and the blocks are all-gathered."""
    stamped = s.faults.once("observation", step)  # the planted fault, not in a spike rerun
    blocks = rollout_blocks(len(examples), s.run.sampling.rollout_block)
    with paced(s.model):  # a sharded base: every process runs as many forwards as the longest
        local = [
            collect_rollouts(
                s, state, step, [examples[g] for g in blocks[b]], list(blocks[b]), stamped
            )
            for b in mine(len(blocks))
        ]
    return [r for block in in_global_order(local, "gathering the rollouts") for r in block]


def collect_rollouts(
    s: Session,
    state: GrpoState,
    step: int,
    examples: list[int],
    slots: list[int] | None = None,
    stamped: bool | None = None,
) -> list[Rollout]:
    """The rollouts of one block of prompt groups: its episodes (`episodes.episode_block`),
    group after group. A single-turn environment's are one-turn episodes, one per group, whose
    prompts are decoded as one batch from one left-padded prefill: every completion token is the
    model's (no model mask), and the group's one observation is on its first sample. A tool
    environment's have every turn sampled by twinrun, a model mask and each turn. `slots` are
    the groups' global indices (default 0, 1, ...), which key the environment's observation
    draws; `stamped`: whether the planted observation fault acts (default: asked of the run's
    faults; it is refused for tool environments)."""
    env = state.env
    if stamped is None:
        stamped = s.faults.once("observation", step)
    slots = list(range(len(examples))) if slots is None else slots
    out = []
    for r in episode_block(s, env, state.rows, step, examples, slots, stamped):
        p = r.prompt_length
        rollout = Rollout(
            r.example, r.k, step, r.tokens[:p], r.tokens[p:], r.logprobs[p:], r.reward
        )
        if env.plan.tool_turns:  # the rows hold the environment's tokens: mask them out
            rollout.model_mask = r.mask[p:]
            rollout.turns = [dataclasses.asdict(t) for t in r.turns]
        else:  # the group's one observation, on its first sample
            rollout.turns = [{"observation": r.turns[0].observation}] if r.k == 0 else None
        out.append(rollout)
    return out


def observation_leaves(fresh: list[Rollout], group: int) -> dict[str, torch.Tensor]:
    """`observation.prompt_G[.sample_K].turn_T`: every model-visible message new at a turn
    (canonical JSON, as `text_leaf`), in prompt, sample, turn order — the first leaves of a step, so
    `twinrun diff` names an observation before the tokens and gradients it changed. A single-turn
    prompt is one per prompt group (`observation.prompt_G.turn_0`)."""
    out: dict[str, torch.Tensor] = {}
    for i, r in enumerate(fresh):
        g, k = divmod(i, group)
        for t, turn in enumerate(r.turns or []):
            name = (
                f"observation.prompt_{g}.turn_{t}"
                if r.model_mask is None
                else (f"observation.prompt_{g}.sample_{k}.turn_{t}")
            )
            out[name] = text_leaf(turn["observation"])
    return out


def text_leaf(text: str) -> torch.Tensor:
    """A text as a leaf: the SHA256 of its UTF-8 bytes as four 48-bit integers (int64), so any
    change to the text — one character, or the order of two — changes the checksum by as much
    as a new text would (a sum of the bytes' squares would hide a permutation and shrink a
    one-character change in a long text below any tolerance)."""
    digest = hashlib.sha256(text.encode()).digest()
    parts = [int.from_bytes(digest[i : i + 6], "big") for i in range(0, 24, 6)]
    return torch.tensor(parts, dtype=torch.int64)


def turn_leaves(fresh: list[Rollout]) -> dict[str, Any]:
    """Tool environments: each turn's prompt ids (the tokens added before it) and sampled tokens,
    rollout after rollout, and each row's model mask; none when no row has a model mask (a
    single-turn environment's: every completion token is the model's)."""
    if all(r.model_mask is None for r in fresh):
        return {}
    i64 = torch.int64
    turns = [t for r in fresh for t in r.turns or []]
    return {
        "rollout.turn_prompt_ids": [torch.tensor(t["prompt"], dtype=i64) for t in turns],
        "rollout.turn_tokens": [torch.tensor(t["sampled"], dtype=i64) for t in turns],
        "rollout.model_mask": [torch.tensor(r.completion_mask(), dtype=i64) for r in fresh],
    }


def remember(state: GrpoState, fresh: list[Rollout]) -> None:
    """After the update is applied, this step's rollouts enter the replay buffer."""
    assert state.replay is not None
    for r in fresh:
        state.replay.add(r, abs(r.advantage))


def replay_draws(s: Session, state: GrpoState, step: int) -> tuple[list[Rollout], dict[str, Any]]:
    """The replayed rollouts of this step and their diag leaves, in dataflow order: the buffer's
    priorities, the draws' uniforms, the slots drawn, the importance weights."""
    buf = state.replay
    if buf is None or len(buf) == 0:
        return [], per_leaves([], [], [])
    rollouts, seed = s.run.record(Rollouts), s.run.seed
    fraction = s.run.record(PerReplay).replay_fraction
    m = max(1, round(fraction * rollouts.prompts_per_step * rollouts.group_size))
    priorities = buf.priorities()
    if s.faults.once("replay", step) or s.faults.once("sampler", step):  # planted: unseeded
        unseeded = random.SystemRandom()
        draws, us = buf.sample_traced(m, lambda i: unseeded.random())
    else:
        draws, us = buf.sample_traced(m, lambda i: stream(seed, "replay", step, i).uniform())
    replayed = []
    for _, item, weight in draws:
        replayed.append(Rollout(**{**item.__dict__, "weight": weight}))
    return replayed, per_leaves(priorities, us, draws)


def per_leaves(priorities: list[float], us: list[float], draws: list[Any]) -> dict[str, Any]:
    f64 = torch.float64
    return {
        "replay.priorities": torch.tensor(priorities, dtype=f64),
        "replay.draws": torch.tensor(us, dtype=f64),
        "replay.sample_indices": torch.tensor([d[0] for d in draws], dtype=torch.int64),
        "replay.weights": torch.tensor([d[2] for d in draws], dtype=f64),
    }


@dataclass
class UpdateRows:
    """A GRPO optimizer batch as tensors: right-padded ids and attention, float64 old logprobs
    of each predicted token, the token-capped mask, advantages and importance weights."""

    ids: torch.Tensor  # [N, W]
    attn: torch.Tensor  # [N, W]
    old: torch.Tensor  # [N, W-1], aligned with the predicted tokens
    kept: torch.Tensor  # [N, W-1] bool
    denominator: int
    advantages: torch.Tensor  # [N] float64
    weights: torch.Tensor  # [N] float64


def update_rows(s: ModelSession, batch: list[UpdateRow]) -> UpdateRows:
    n, width = len(batch), max(len(r.tokens) for r in batch)
    ids = torch.full((n, width), s.tok.pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    comp = torch.zeros((n, width), dtype=torch.bool)
    old = torch.zeros((n, width), dtype=torch.float64)
    for i, r in enumerate(batch):
        p, t = len(r.prompt_ids), len(r.tokens)
        ids[i, :t] = torch.tensor(r.tokens)
        attn[i, :t] = 1
        comp[i, p:t] = torch.tensor(r.completion_mask(), dtype=torch.bool)
        old[i, p:t] = torch.tensor(r.old_logprobs, dtype=torch.float64)
    kept, _, denominator = apply_token_cap(comp[:, 1:], s.run.record(PolicyUpdate).token_cap)
    return UpdateRows(
        ids, attn, old[:, 1:], kept, denominator,
        torch.tensor([r.advantage for r in batch], dtype=torch.float64),
        torch.tensor([r.weight for r in batch], dtype=torch.float64),
    )  # fmt: skip


def policy_logprobs(
    s: ModelSession,
    ids: torch.Tensor,
    attn: torch.Tensor,
    kept: torch.Tensor,
    temperature: float,
    keep_all: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One update forward's kept logprobs and, with `keep_all` (`--diag`'s `forward.logits`),
    its whole logits (no grad). Only the kept positions' logits are made for the backward
    (`CausalLM.logits_at`: the output head runs on their hidden states alone), so a long
    multi-turn row, which trains a fraction of its positions, makes no [N, W, V] tensor for it.
    More kept positions than one head chunk: the head runs on them by chunks too
    (`model/head_chunks.py`), so not even their [K, V] float32 logits are kept."""
    model, at = s.model, kept_at(kept)
    if not chunks_head(model, int(kept.sum())):
        rows, logits = model.logits_at(ids, attn, at, keep_all)
        logp = rows_logprobs(rows, ids, kept, temperature)
        return logp, [] if logits is None else [logits]
    hidden = model.last_hidden(ids, attn)
    head = model.hf.get_output_embeddings()
    targets = ids[:, 1:][kept]
    picked = by_chunks(hidden[at], head, picked_rows, targets, 0, (temperature,), model.autocast)
    logp = torch.zeros(kept.shape, dtype=torch.float64, device=picked.device)
    return logp.masked_scatter(kept, picked), [whole_logits(model, hidden)] if keep_all else []


def update_forwards(s: ModelSession, batch: list[UpdateRow], step: int) -> StepForwards:
    """The PPO-clip update on `batch`, in forwards of `batch_size` rows (replay runs this); with
    `--kl-beta`, each forward's rows run once more through the reference (the base, adapter
    off, no grad) for the KL term — a replay recomputes it from the same model."""
    policy, device = s.run.record(PolicyUpdate), s.run.backend.device
    kl_beta = s.run.sampling.kl_beta
    u = update_rows(s, batch)
    n, bs = len(batch), s.run.batch_size
    parts = []  # (loss, clipped, active) of this process's forwards (all without torchrun)
    for f, padding in forward_slots(-(-n // bs), s.model):
        sl = slice(f * bs, min(n, f * bs + bs))
        w = int(u.attn[sl].sum(dim=1).max())
        f_ids, f_attn = u.ids[sl, :w].to(device), u.attn[sl, :w].to(device)
        kept = u.kept[sl, : w - 1].to(device)
        with dropout_for(s, step, [(i,) for i in range(sl.start, sl.stop)]):
            logp, logits = policy_logprobs(
                s, f_ids, f_attn, kept, policy.temperature, s.run.switches.diag
            )
        kl = None
        if kl_beta:  # --kl-beta: the reference is the base (adapter off), no grad
            with torch.no_grad(), lora_disabled(s.model):
                ref, _ = policy_logprobs(s, f_ids, f_attn, kept, policy.temperature)
            kl = (kl_beta, ref)
        out = grpo_loss(
            logp, u.old[sl, : w - 1].to(device), u.advantages[sl].to(device),
            kept, u.denominator, policy.clip_eps, u.weights[sl].to(device), kl,
        )  # fmt: skip
        yield Forward(out.loss, out.row_losses, [f_ids], logits, padding=padding)
        if padding:
            continue
        parts.append((float(out.loss.detach()), out.clipped_tokens, out.active_tokens))
    loss_sum = 0.0
    clipped = active = 0
    for part_loss, part_clipped, part_active in in_global_order(parts):  # forward 0 first
        loss_sum += part_loss
        clipped += part_clipped
        active += part_active
    return StepOutcome(
        loss=loss_sum,
        tokens=u.denominator,
        rows=n,
        metrics={"clip_fraction": clipped / active if active else 0.0},
        batch=optimizer_batch(batch, u, step, bs),
    )


def optimizer_batch(batch: list[UpdateRow], u: UpdateRows, step: int, bs: int) -> OptimizerBatch:
    """What the update trained on, as capture writes it."""
    n, width = u.ids.shape
    full_old = torch.zeros((n, width), dtype=torch.float64)
    full_old[:, 1:] = u.old
    kept_rows = [[0, *u.kept[i, : len(r.tokens) - 1].long().tolist()] for i, r in enumerate(batch)]
    return OptimizerBatch(
        objective="grpo",
        step=step,
        rows=[r.tokens for r in batch],
        loss_masks=kept_rows,
        forward_sizes=[min(bs, n - a) for a in range(0, n, bs)],
        denominator=u.denominator,
        update=UpdateColumns(
            old_logprobs=[full_old[i, : len(r.tokens)].tolist() for i, r in enumerate(batch)],
            advantages=u.advantages.tolist(),
            weights=u.weights.tolist(),
            prompt_lengths=[len(r.prompt_ids) for r in batch],
            model_mask=model_masks(batch),
        ),
    )


def model_masks(batch: list[UpdateRow]) -> list[list[int]] | None:
    """Per row and token, 1 on the model's sampled tokens, when a row holds tool or environment
    tokens; None for single-turn batches (every completion token is the model's)."""
    if all(r.model_mask is None for r in batch):
        return None
    return [[0] * len(r.prompt_ids) + r.completion_mask() for r in batch]


def rows_from_batch(batch: OptimizerBatch) -> list[UpdateRow]:
    """The update rows of a captured GRPO batch (what `update_forwards` trains on again)."""
    u = batch.update
    if u is None:
        raise ContractError(
            f"a captured {batch.objective} batch holds no update columns",
            "re-capture the step",
        )
    out = []
    for i, row in enumerate(batch.rows):
        p = u.prompt_lengths[i]
        mask = None if u.model_mask is None else list(u.model_mask[i][p:])
        out.append(UpdateRow(
            prompt_ids=list(row[:p]), completion=list(row[p:]),
            old_logprobs=list(u.old_logprobs[i][p:]), advantage=u.advantages[i],
            weight=u.weights[i], model_mask=mask,
        ))  # fmt: skip
    return out
