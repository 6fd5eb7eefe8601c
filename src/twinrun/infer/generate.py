"""`twinrun generate` as a library call: validate, build, generate, decode."""

from __future__ import annotations

from typing import Any

from twinrun.config.inference import GenerateConfig
from twinrun.core.errors import ConfigError
from twinrun.model.prelude import open_for_inference


def run_generate(cfg: GenerateConfig) -> dict[str, Any]:
    r = cfg.resolve()  # before torch is imported
    p = open_for_inference(cfg)  # the checkpoint's config is read first: a wrong path, no torch
    import torch

    from twinrun.core.rng import stream
    from twinrun.model.decoding import generate as generate_tokens

    messages = [{"role": "user", "content": r.prompt}]
    prompt_ids = p.tok.prompt_ids(messages, p.templated)
    positions = p.max_length()
    if len(prompt_ids) + r.max_new_tokens > positions:
        raise ConfigError(
            f"--max-new-tokens {r.max_new_tokens} after a prompt of {len(prompt_ids)} tokens "
            f"runs past the model's {positions} positions",
            f"use --max-new-tokens {max(positions - len(prompt_ids), 0)} or less",
        )
    model = p.build(precision=r.precision)
    if r.steering is not None:
        from twinrun.infer.steering import attach_steering

        attach_steering(model, *r.steering)
    seed = r.seed

    def sample_draw(position: int) -> float:
        assert seed is not None  # resolve() gives one when sampling
        return stream(seed, "sample", position).uniform()

    draw = None if seed is None else sample_draw  # greedy takes no draw

    with torch.no_grad():
        result = generate_tokens(
            model,
            prompt_ids,
            r.max_new_tokens,
            r.temperature,
            draw=draw,
            end_ids=p.tok.end_ids,
        )
    tokens = list(result.tokens)
    return {"prompt_tokens": prompt_ids, "tokens": tokens, "text": p.tok.decode(tokens)}
