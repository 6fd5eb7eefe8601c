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

from pathlib import Path
from typing import Any

from twinrun.config.inference import ExtractConfig, ExtractRun
from twinrun.core.errors import ConfigError, DataError
from twinrun.model.prelude import Prelude, open_for_inference

HIDDEN_FORMAT = "twinrun.hidden.v1"
STEERING_FORMAT = "twinrun.infer.steering.v1"
STEERING_KEY = "steering_vector"


def claim_outputs(cfg: ExtractConfig) -> None:
    """Before the model loads: one check of both files, neither an input nor another's."""
    from twinrun.core.owned import claim_file, json_format

    inputs = {"model": cfg.model, "adapter": cfg.adapter, "examples": cfg.examples}
    sidecar_ours = json_format(HIDDEN_FORMAT, STEERING_FORMAT)

    def tensors_ours(path: Path) -> bool:  # the sidecar beside it records these bytes
        from twinrun.core.digest import sha256_file
        from twinrun.core.jsonlimits import load_json_file

        if not sidecar_ours(cfg.sidecar_path):
            return False
        record = load_json_file(cfg.sidecar_path, "extract sidecar")
        return record.get("output_sha256") == sha256_file(path)

    claim_file(cfg.out_path, cfg.overwrite, "twinrun extract", tensors_ours, inputs)
    claim_file(cfg.sidecar_path, cfg.overwrite, "twinrun extract", sidecar_ours, inputs)


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


def pooled_hidden(model: Any, rows: list[Any], pad_id: int, r: ExtractRun, device: str) -> Any:
    """float32 [N, H]: each row's residual stream at `r.layer`, pooled, in input order."""

    import torch

    from twinrun.data.batching import pad_rows

    bs = r.batch_size
    parts = []
    with torch.no_grad():
        for start in range(0, len(rows), bs):
            batch = rows[start : start + bs]
            ids, attn, _ = (t.to(device) for t in pad_rows(batch, pad_id))
            hidden = model.run(ids, attn, hidden_layer=r.layer).hidden
            for b, row in enumerate(batch):
                n = len(row.input_ids)
                if r.pool == "last":
                    parts.append(hidden[b, n - 1].float().cpu())
                else:  # the row's own real positions, as a [1, n, H] tensor
                    parts.append(hidden[b : b + 1, :n].float().mean(dim=1)[0].cpu())
    return torch.stack(parts)


def run_extract(cfg: ExtractConfig) -> dict[str, Any]:
    """Check, build, extract, write OUT.safetensors and OUT.json; returns the sidecar."""
    r = cfg.resolve()  # before torch is imported
    from twinrun.infer.inputs import read_examples

    claim_outputs(cfg)
    p = open_for_inference(cfg)
    layers = int(p.config.get("num_hidden_layers", 0))
    if r.layer > layers:
        raise ConfigError(
            f"--layer must be in [0, {layers}] for this model ({layers} decoder layers), "
            f"got {r.layer}",
            "0 is the embeddings, L the output of decoder layer L-1",
        )
    raw, kind = read_examples(r.examples)
    if cfg.steering and kind != "pairs":
        raise ConfigError(
            "--steering needs preference pairs ({prompt, chosen, rejected} rows)",
            f"{cfg.examples} has none",
        )
    if kind == "pairs":
        from twinrun.data.pairs import encode_pairs

        pairs = encode_pairs(p.tok, raw, p.templated, p.max_length())
        sides = {"chosen": [e.chosen for e in pairs], "rejected": [e.rejected for e in pairs]}
    else:
        sides = {"hidden": encode_examples(p.tok, raw, p.templated, p.max_length())}
    model = p.build(precision=r.precision, batch_invariant=cfg.batch_invariant)
    tensors = {
        name: pooled_hidden(model, rows, p.tok.pad_id, r, cfg.device)
        for name, rows in sides.items()
    }
    if cfg.steering:
        vector = tensors["chosen"].double().mean(dim=0) - tensors["rejected"].double().mean(dim=0)
        tensors = {STEERING_KEY: vector.float()}
    return write_outputs(cfg, tensors, len(raw), model, p)


def write_outputs(
    cfg: ExtractConfig, tensors: dict[str, Any], count: int, model: Any, p: Prelude
) -> dict[str, Any]:
    """OUT.safetensors (metadata at its top level, keys sorted: the same bytes every run) and the
    OUT.json sidecar, atomically."""
    from twinrun.core.determinism import runtime_versions
    from twinrun.core.digest import sha256_file
    from twinrun.core.fileio import atomic_write_json
    from twinrun.core.safetensors_io import write_tensors
    from twinrun.data.examples import examples_sha256

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
        "model_sha256": p.model_sha256(),
        "data_sha256": examples_sha256(str(cfg.examples)),
        "adapter_sha256": p.adapter_sha256(),
    }
    strings = {k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
               for k, v in meta.items()}  # fmt: skip
    contiguous = {k: v.contiguous() for k, v in tensors.items()}
    write_tensors(cfg.out_path, contiguous, strings)
    record = meta | {
        "tensors": {k: list(v.shape) for k, v in tensors.items()},
        "output": cfg.out_path.name,
        "output_sha256": sha256_file(cfg.out_path),
        "inputs": {"model": str(cfg.model), "examples": str(cfg.examples), "adapter": cfg.adapter},
        "determinism": p.provenance,
        "runtime": runtime_versions(),
    }
    atomic_write_json(cfg.sidecar_path, record)
    return record
