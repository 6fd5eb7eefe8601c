"""`twinrun extract`: hidden states per example, and steering vectors from preference pairs.

What is extracted. Each example is encoded exactly as training encodes it (TRL's tokens, see
`twinrun.model.tokens`; a row with only a `prompt` is the prompt's ids, with the assistant turn
opened when the chat template is on), run through the model (plus `--adapter`), and the
residual stream is read at `--layer L` — HF's `hidden_states[L]`: 0 is the embeddings, L the
output of decoder layer L-1, and L = num_layers the last layer's output before the final norm
(transformers' own last entry has the final norm applied). `--pool last` takes the row's last
real token (for a prompt + completion row: the last token of the completion — eos, or the
template's end of turn and what follows it);
`--pool mean` averages the row's real tokens, summed in float32 over the row alone. Results are
float32 `[N, H]` in input order: key `hidden` for an examples file, keys `chosen` and `rejected`
for a pair file.

Steering (`--steering`, pair files only). Both sides of every pair are pooled as above and

    vector = mean_i pooled(chosen_i) - mean_i pooled(rejected_i)      (float64 means, then f32)

is written under the key `steering_vector` ([H]). `twinrun generate --steer FILE --steer-scale S`
adds `S * vector` to the residual stream at the same layer, at every position
(`twinrun.infer.steering`). With `--pool last` the vector contrasts the states that have read a
whole answer; the shared prompt tokens never enter it.

Files. `OUT.safetensors` carries string metadata at its top level — format, layer, pool,
precision, chat template, batch size, batch-invariant, the model/data/adapter SHA256; its keys
sorted, so a rerun writes the same bytes (`twinrun.core.safetensors_bytes`) — and
`OUT.json` is the sidecar: the same, plus tensor shapes, the output's own SHA256, determinism
provenance and library versions. Batching: rows go through forwards of `--batch-size` in input
order; with `--batch-invariant` each row's hidden states are bitwise what a batch of one gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.config.run import common_problems, require_flags
from twinrun.config.values import resolve_max_length
from twinrun.core.errors import ConfigError, DataError
from twinrun.core.portable import default_mode

HIDDEN_FORMAT = "twinrun.hidden.v1"
STEERING_FORMAT = "twinrun.infer.steering.v1"
STEERING_KEY = "steering_vector"
POOLS = ("last", "mean")


@dataclass(kw_only=True)
class ExtractConfig:
    model: str | None = None
    adapter: str | None = None
    examples: str | None = None
    layer: int | None = None
    pool: str | None = None
    chat_template: str | None = None
    precision: str | None = None
    batch_size: int | None = None
    output: str | None = None
    steering: bool = False
    batch_invariant: bool = False
    threads: int | None = None
    device: str = "cpu"
    cpu_kernels: str = field(default_factory=default_mode)
    strict: bool = True
    overwrite: bool = False
    quiet: bool = False

    def validate(self) -> None:
        flags = {
            "--model": self.model,
            "--examples": self.examples,
            "--layer": self.layer,
            "--pool": self.pool,
            "--chat-template": self.chat_template,
            "--precision": self.precision,
            "--batch-size": self.batch_size,
            "--output": self.output,
        }
        if self.device == "cpu":  # the thread count shapes CPU results
            flags["--threads"] = self.threads
        require_flags(flags, "extract")
        problems = common_problems(
            batch_size=self.batch_size,
            precision=self.precision,
            chat_template=self.chat_template,
            threads=self.threads,
        )
        if self.layer is not None and self.layer < 0:
            problems.append(f"--layer must be >= 0, got {self.layer}")
        if self.pool not in POOLS:
            problems.append("--pool must be last or mean")  # no value shown: a secret?
        if not str(self.output).endswith(".safetensors"):
            problems.append("--output must end in .safetensors")
        if problems:
            raise ConfigError("; ".join(problems))
        from twinrun.core.owned import claim_file, json_format

        inputs = {"model": self.model, "adapter": self.adapter, "examples": self.examples}
        sidecar_ours = json_format(HIDDEN_FORMAT, STEERING_FORMAT)

        def tensors_ours(path: Path) -> bool:  # the sidecar beside it records these bytes
            from twinrun.core.digest import sha256_file
            from twinrun.core.jsonlimits import load_json_file

            if not sidecar_ours(self.sidecar_path):
                return False
            record = load_json_file(self.sidecar_path, "extract sidecar")
            return record.get("output_sha256") == sha256_file(path)

        # before the model loads: one check of both files, neither an input nor another's
        claim_file(self.out_path, self.overwrite, "twinrun extract", tensors_ours, inputs)
        claim_file(self.sidecar_path, self.overwrite, "twinrun extract", sidecar_ours, inputs)

    @property
    def out_path(self) -> Path:
        return Path(str(self.output))

    @property
    def sidecar_path(self) -> Path:
        return self.out_path.with_suffix(".json")


def encode_examples(tok: Any, raw: list[Any], chat: bool, max_len: int) -> list[Any]:
    """Prompt + completion rows (as SFT encodes them), or prompt-only rows."""
    from twinrun.data.examples import (
        EncodedRow,
        check_length,
        encode_prompt_completion,
        require_str,
        sft_parts,
    )

    out = []
    for row in raw:
        if "completion" in row.data or "messages" in row.data:
            messages, completion = sft_parts(row)
            enc = encode_prompt_completion(tok, messages, completion, chat)
        elif "prompt" in row.data:
            msgs = [{"role": "user", "content": require_str(row, "prompt")}]
            ids = tuple(tok.prompt_ids(msgs, chat))
            enc = EncodedRow(ids, (0,) * len(ids))
        else:
            raise DataError(
                f"{row.where}: a row needs 'prompt' (optionally with 'completion'), 'messages', "
                "or 'prompt'/'chosen'/'rejected'",
                f"found fields: {', '.join(sorted(row.data)) or 'none'}",
            )
        check_length(enc, row.where, max_len)
        out.append(enc)
    return out


def pooled_hidden(model: Any, rows: list[Any], pad_id: int, cfg: ExtractConfig) -> Any:
    """float32 [N, H]: each row's residual stream at `cfg.layer`, pooled, in input order."""

    import torch

    from twinrun.data.batching import pad_rows

    bs = cfg.batch_size
    assert bs is not None
    parts = []
    with torch.no_grad():
        for start in range(0, len(rows), bs):
            batch = rows[start : start + bs]
            ids, attn, _ = (t.to(cfg.device) for t in pad_rows(batch, pad_id))
            hidden = model.run(ids, attn, hidden_layer=cfg.layer).hidden
            for b, row in enumerate(batch):
                n = len(row.input_ids)
                if cfg.pool == "last":
                    parts.append(hidden[b, n - 1].float().cpu())
                else:  # the row's own real positions, as a [1, n, H] tensor
                    parts.append(hidden[b : b + 1, :n].float().mean(dim=1)[0].cpu())
    return torch.stack(parts)


def run_extract(cfg: ExtractConfig) -> dict[str, Any]:
    """Validate, build, extract, write OUT.safetensors and OUT.json; returns the sidecar."""
    from twinrun.core.determinism import establish
    from twinrun.data.examples import load_rows
    from twinrun.model.build import build_model
    from twinrun.model.loading import read_model_config
    from twinrun.model.tokens import load_tokenizer

    cfg.validate()
    model_dir = Path(str(cfg.model))
    config = read_model_config(model_dir)
    layers = int(config.get("num_hidden_layers", 0))
    assert cfg.layer is not None
    if cfg.layer > layers:
        raise ConfigError(
            f"--layer must be in [0, {layers}] for this model ({layers} decoder layers), "
            f"got {cfg.layer}",
            "0 is the embeddings, L the output of decoder layer L-1",
        )
    max_len = resolve_max_length(None, config)
    tok = load_tokenizer(model_dir)
    raw = load_rows(str(cfg.examples))
    chat = cfg.chat_template == "on"
    is_pairs = any("chosen" in r.data or "rejected" in r.data for r in raw)
    if cfg.steering and not is_pairs:
        raise ConfigError(
            "--steering needs preference pairs ({prompt, chosen, rejected} rows)",
            f"{cfg.examples} has none",
        )
    if is_pairs:
        from twinrun.data.pairs import encode_pairs

        pairs = encode_pairs(tok, raw, chat, max_len)
        sides = {"chosen": [p.chosen for p in pairs], "rejected": [p.rejected for p in pairs]}
    else:
        sides = {"hidden": encode_examples(tok, raw, chat, max_len)}
    if cfg.adapter is not None:
        from twinrun.model.lora import read_adapter_config

        read_adapter_config(cfg.adapter)  # fail before building anything
    provenance = establish(
        strict=cfg.strict, threads=cfg.threads, device=cfg.device, cpu_kernels=cfg.cpu_kernels
    )
    model = build_model(
        model_dir,
        precision=str(cfg.precision),
        device=cfg.device,
        adapter=cfg.adapter,
        batch_invariant=cfg.batch_invariant,
    )
    tensors = {name: pooled_hidden(model, rows, tok.pad_id, cfg) for name, rows in sides.items()}
    if cfg.steering:
        vector = tensors["chosen"].double().mean(dim=0) - tensors["rejected"].double().mean(dim=0)
        tensors = {STEERING_KEY: vector.float()}
    return write_outputs(cfg, tensors, len(raw), model, model_dir, provenance)


def write_outputs(
    cfg: ExtractConfig,
    tensors: dict[str, Any],
    count: int,
    model: Any,
    model_dir: Path,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """OUT.safetensors (metadata at its top level, keys sorted: the same bytes every run) and the
    OUT.json sidecar, atomically."""
    from twinrun.core.determinism import runtime_versions
    from twinrun.core.digest import sha256_file
    from twinrun.core.fileio import atomic_write_json, atomic_write_with
    from twinrun.core.safetensors_io import save_tensors_file
    from twinrun.data.examples import examples_sha256
    from twinrun.model.loading import model_sha256

    adapter_sha = (
        sha256_file(Path(cfg.adapter) / "adapter_model.safetensors") if cfg.adapter else None
    )
    meta: dict[str, Any] = {
        "format": STEERING_FORMAT if cfg.steering else HIDDEN_FORMAT,
        "layer": cfg.layer,
        "pool": cfg.pool,
        "precision": cfg.precision,
        "chat_template": cfg.chat_template,
        "batch_size": cfg.batch_size,
        "batch_invariant": cfg.batch_invariant,
        "examples": count,
        "hidden_size": model.hidden_size,
        "num_layers": model.num_layers,
        "model_sha256": model_sha256(model_dir),
        "data_sha256": examples_sha256(str(cfg.examples)),
        "adapter_sha256": adapter_sha,
    }
    strings = {k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
               for k, v in meta.items()}  # fmt: skip
    contiguous = {k: v.contiguous() for k, v in tensors.items()}
    atomic_write_with(cfg.out_path, lambda tmp: save_tensors_file(contiguous, tmp, strings))
    record = meta | {
        "tensors": {k: list(v.shape) for k, v in tensors.items()},
        "output": cfg.out_path.name,
        "output_sha256": sha256_file(cfg.out_path),
        "inputs": {"model": str(cfg.model), "examples": str(cfg.examples), "adapter": cfg.adapter},
        "determinism": provenance,
        "runtime": runtime_versions(),
    }
    atomic_write_json(cfg.sidecar_path, record)
    return record
