"""What every process of a data-parallel run must agree on before it trains: the settings that
shape the run (the sidecar's `train` numbers) and the SHA256 of every input (model, tokenizer,
examples or corpus, evaluation examples, initial adapter). Paths are left out — each node may
mount its inputs elsewhere; their digests say whether they are the same bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from twinrun.config.run import Settings

# the inputs record's digests, by the name an error line gives them
DIGESTS = {
    "model_sha256": "model sha256",
    "tokenizer_sha256": "tokenizer sha256",
    "data_sha256": "examples/corpus sha256",
    "eval_sha256": "eval examples sha256",
    "init_adapter_sha256": "init adapter sha256",
}
PATHS = ("model", "examples", "corpus", "eval_examples", "init_adapter", "output")


def agreement_record(
    cfg: Settings, inputs: dict[str, Any], model_outline: str | None = None
) -> dict[str, Any]:
    """This process's settings and input digests, every value printable: `--env-arg` values (they
    may hold secrets, and the sidecar records them redacted) are compared by their SHA256, and a
    CUDA device by its kind (each process has its own `cuda:LOCAL_RANK`). `model_outline`: under
    `--shard-base` the inputs hold rank 0's model SHA256 on every process, and what this process
    compares as its `model sha256` is its own digest of the model's files beside the weights
    and of the weights' headers (`model.shard_digests.outline_sha256`; the weights' bytes are
    checked as each process reads its rows)."""
    record = {k: v for k, v in inputs["train"].items() if k not in PATHS}
    if "device" in record and str(record["device"]).startswith("cuda"):
        record["device"] = "cuda"
    env_args = cfg.value("env_args")
    if env_args is not None:
        raw = json.dumps(env_args, sort_keys=True, default=repr).encode()
        record["env_args"] = "sha256 " + hashlib.sha256(raw).hexdigest()[:16]
    record["resume"] = bool(cfg.value("resume"))
    record["shard_base"] = bool(cfg.value("shard_base"))
    for key, name in DIGESTS.items():
        record[name] = inputs.get(key)
    if model_outline is not None:
        record[DIGESTS["model_sha256"]] = model_outline
    return record
