"""`twinrun generate` as a library call: validate, build, generate, decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.config.run import common_problems, require_flags
from twinrun.config.values import resolve_max_length
from twinrun.core.errors import ConfigError
from twinrun.core.portable import default_mode


@dataclass(kw_only=True)
class GenerateConfig:
    model: str | None = None
    adapter: str | None = None
    prompt: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    chat_template: str | None = None
    seed: int | None = None
    precision: str | None = None
    steer: str | None = None
    steer_scale: float | None = None
    device: str = "cpu"
    cpu_kernels: str = field(default_factory=default_mode)
    threads: int | None = None
    strict: bool = True

    def validate(self) -> None:
        flags = {
            "--model": self.model,
            "--prompt": self.prompt,
            "--max-new-tokens": self.max_new_tokens,
            "--temperature": self.temperature,
            "--chat-template": self.chat_template,
            "--precision": self.precision,
        }
        if self.temperature != 0:  # greedy decoding draws nothing: it needs no seed
            flags["--seed"] = self.seed
        if self.device == "cpu":  # the thread count shapes CPU results
            flags["--threads"] = self.threads
        require_flags(flags, "generate")
        problems = common_problems(
            precision=self.precision, chat_template=self.chat_template, threads=self.threads
        )
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            problems.append(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature is not None and self.temperature < 0:
            problems.append(f"--temperature must be >= 0, got {self.temperature}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            problems.append(f"--seed must be in [0, 2**63), got {self.seed}")
        if (self.steer is None) != (self.steer_scale is None):
            problems.append("--steer and --steer-scale go together")
        if problems:
            raise ConfigError("; ".join(problems))


def run_generate(cfg: GenerateConfig) -> dict[str, Any]:
    import torch

    from twinrun.core.determinism import establish
    from twinrun.core.rng import stream
    from twinrun.model.build import build_model
    from twinrun.model.decoding import generate as generate_tokens
    from twinrun.model.loading import read_model_config as read_config
    from twinrun.model.tokens import load_tokenizer

    cfg.validate()
    model_dir = Path(cfg.model)  # type: ignore[arg-type]  # validate() requires it
    model_config = read_config(model_dir)
    tok = load_tokenizer(model_dir)
    messages = [{"role": "user", "content": str(cfg.prompt)}]
    prompt_ids = tok.prompt_ids(messages, cfg.chat_template == "on")
    positions = resolve_max_length(None, model_config)
    if len(prompt_ids) + int(cfg.max_new_tokens or 0) > positions:
        raise ConfigError(
            f"--max-new-tokens {cfg.max_new_tokens} after a prompt of {len(prompt_ids)} tokens "
            f"runs past the model's {positions} positions",
            f"use --max-new-tokens {max(positions - len(prompt_ids), 0)} or less",
        )
    establish(
        strict=cfg.strict, threads=cfg.threads, device=cfg.device, cpu_kernels=cfg.cpu_kernels
    )
    model = build_model(model_dir, precision=cfg.precision, device=cfg.device, adapter=cfg.adapter)  # type: ignore[arg-type]  # validate() requires it
    if cfg.steer is not None:
        from twinrun.infer.steering import attach_steering

        attach_steering(model, cfg.steer, cfg.steer_scale)  # type: ignore[arg-type]  # validate() requires it
    seed = cfg.seed

    def sample_draw(position: int) -> float:
        assert seed is not None  # validate() requires it when sampling
        return stream(seed, "sample", position).uniform()

    draw = None if cfg.temperature == 0 else sample_draw  # greedy takes no draw

    with torch.no_grad():
        result = generate_tokens(
            model,
            prompt_ids,
            cfg.max_new_tokens,  # type: ignore[arg-type]  # validate() requires it
            cfg.temperature,  # type: ignore[arg-type]  # validate() requires it
            draw=draw,
            end_ids=tok.end_ids,
        )
    tokens = list(result.tokens)
    return {"prompt_tokens": prompt_ids, "tokens": tokens, "text": tok.decode(tokens)}
