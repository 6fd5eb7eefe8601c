"""twinrun's own pure-torch Llama, numerically equal to Hugging Face's `LlamaForCausalLM` with
eager attention, loaded straight from a checkpoint directory (no transformers import).

Module names match HF (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`, ...,
`model.norm`, `lm_head`), so state-dict keys are the checkpoint's keys. Attention is written out:
scores = q·kᵀ·scale, disallowed keys filled with the dtype's most negative finite value, softmax
in float32. RMSNorm runs in float32 as HF's does. Rotary embeddings support the `default`,
`linear` and `llama3` rope types.

Batches are right-padded: position ids are 0..T-1 (plus the cache length) in every row, and every
padded key is masked out of every query, causally. `forward` returns float32 logits [B, T, V].
`run(..., hidden_layer=L)` also returns the residual stream at HF's `hidden_states[L]` (0 = the
embeddings, L = output of decoder layer L-1; for L = num_layers it is the stream *before* the
final norm, whereas HF's last entry is after it); `steer=(L, v)` adds `v` to the residual stream
at that same point (the returned hidden state includes it). A steering vector attached with
`model.steering = (L, v)` (see `twinrun.infer.steering`) is used whenever `steer` is not given.

Batch-invariant mode (`model.batch_invariant = True`, `--batch-invariant`): a forward without a KV
cache runs each row on its own, cut to its real length — exactly the forward a batch of one gives
that row, with every matmul, softmax and norm at shapes that depend on the row alone — and
right-pads the results with zeros (logits and hidden states at padded positions are 0). So every
row's logits, hidden states and gradients are bitwise what `--batch-size 1` gives it, whatever
rode in the batch with it. While gradients are recorded, each row sees the trainable parameters
through its own alias, and the rows' gradients are added into `.grad` one row at a
time, in row order — the order in which a run at batch size 1 adds them — instead of in the order
autograd happens to reach them. The logits of such a forward carry the attribute
`twinrun_batch_invariant` (`objectives.sft.BATCH_INVARIANT_TAG`), which makes the loss
reductions sum each row over its own span instead of over the padded width. The machinery is in
`twinrun.model.invariant`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from twinrun.core.errors import ModelError
from twinrun.model.loading import LlamaSpec, read_model_config, weight_files

PRECISIONS = {"f32": torch.float32, "bf16": torch.bfloat16}


def rope_inv_freq(spec: LlamaSpec) -> torch.Tensor:
    """float32 inverse frequencies, computed exactly as transformers does for each rope type."""
    dim = spec.head_dim
    base = spec.rope["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = spec.rope["rope_type"]
    if kind == "linear":
        inv_freq = inv_freq / spec.rope["factor"]
    elif kind == "llama3":
        factor = spec.rope["factor"]
        low, high = spec.rope["low_freq_factor"], spec.rope["high_freq_factor"]
        old_len = spec.rope["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class KVCache:
    """Per-layer keys/values (post-rope, [B, kv_heads, S, head_dim]) and the key-validity mask."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.mask: torch.Tensor | None = None  # [B, S] bool

    @property
    def length(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            k = torch.cat((old_k, k), dim=2)
            v = torch.cat((old_v, v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, spec: LlamaSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
        )
        self.groups = spec.num_heads // spec.num_kv_heads
        self.scaling = self.head_dim**-0.5
        h, bias = spec.hidden_size, spec.attention_bias
        self.q_proj = nn.Linear(h, spec.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * self.head_dim, h, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        allowed: torch.Tensor,
        cache: KVCache | None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        if self.groups > 1:  # GQA: each kv head serves `groups` consecutive query heads
            k = k.repeat_interleave(self.groups, dim=1)
            v = v.repeat_interleave(self.groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        h, i, bias = spec.hidden_size, spec.intermediate_size, spec.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: LlamaSpec, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(spec, layer)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        allowed: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """HF's `LlamaModel` (the `model.` prefix): embeddings, decoder layers, final norm."""

    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


@dataclass
class LlamaOutput:
    logits: torch.Tensor  # [B, T, V] float32
    hidden: torch.Tensor | None = None  # [B, T, H] model dtype, when `hidden_layer` was asked


class TwinLlama(nn.Module):
    """A Llama causal LM whose state-dict keys and numerics are HF's `LlamaForCausalLM`'s."""

    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = LlamaBody(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        # A plain attribute, not a buffer: `.to(bfloat16)` must not round the frequencies.
        with torch.device("cpu"):  # never on meta: the reference kernels there import dynamo
            self.inv_freq = rope_inv_freq(spec)
        self.gradient_checkpointing = False
        self.batch_invariant = False
        self.steering: tuple[int, torch.Tensor] | None = None  # used when `steer` is not given

    @property
    def num_layers(self) -> int:
        return self.spec.num_layers

    def new_cache(self) -> KVCache:
        return KVCache(self.spec.num_layers)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        steer: tuple[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """float32 logits [B, T, V] for right-padded `input_ids` [B, T] (mask 1 = real token)."""
        return self.run(input_ids, attention_mask, kv_cache, steer=steer).logits

    def hidden_states_at(
        self, input_ids: torch.Tensor, layer: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The residual stream at HF's `hidden_states[layer]` ([B, T, H])."""
        hidden = self.run(input_ids, attention_mask, hidden_layer=layer).hidden
        assert hidden is not None
        return hidden

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        hidden_layer: int | None = None,
        steer: tuple[int, torch.Tensor] | None = None,
    ) -> LlamaOutput:
        """The full forward; see the module docstring for `hidden_layer`, `steer` and
        batch-invariant mode."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if steer is None:
            steer = self.steering
        n = self.spec.num_layers
        for label, at in (("hidden_layer", hidden_layer), ("steer layer", steer and steer[0])):
            if at is not None and not 0 <= at <= n:
                raise ValueError(f"{label} must be in [0, {n}], got {at}")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError("attention_mask must have the shape of input_ids")
        if self.batch_invariant:
            if kv_cache is None:
                from twinrun.model.invariant import run_rows

                return run_rows(self, input_ids, attention_mask, hidden_layer, steer)
            if input_ids.shape[0] != 1:
                raise ValueError("batch-invariant mode runs a KV cache for one row only")
        return self.run_batch(input_ids, attention_mask, kv_cache, hidden_layer, steer)

    def run_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        kv_cache: KVCache | None,
        hidden_layer: int | None,
        steer: tuple[int, torch.Tensor] | None,
    ) -> LlamaOutput:
        """The ordinary batched forward: right-padded rows, padded keys masked out."""
        n = self.spec.num_layers
        b, t = input_ids.shape
        device = input_ids.device
        if attention_mask is None:
            key_mask = torch.ones(b, t, dtype=torch.bool, device=device)
        else:
            key_mask = attention_mask.to(device) != 0
        past = 0 if kv_cache is None else kv_cache.length
        if kv_cache is not None:
            if kv_cache.mask is not None:
                key_mask = torch.cat((kv_cache.mask, key_mask), dim=1)
            kv_cache.mask = key_mask
        positions = torch.arange(past, past + t, device=device)
        causal = positions[:, None] >= torch.arange(past + t, device=device)[None, :]
        allowed = (causal[None, :, :] & key_mask[:, None, :]).unsqueeze(1)  # [B, 1, T, S]

        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions[None, :], x.dtype)
        hidden = None
        for i in range(n + 1):
            if steer is not None and steer[0] == i:
                x = x + steer[1].to(device=x.device, dtype=x.dtype)
            if hidden_layer == i:
                hidden = x
            if i == n:
                break
            layer = self.model.layers[i]
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(layer, x, cos, sin, allowed, kv_cache, use_reentrant=False)
            else:
                x = layer(x, cos, sin, allowed, kv_cache)
        logits = self.lm_head(self.model.norm(x)).float()
        return LlamaOutput(logits=logits, hidden=hidden)


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Skip Linear/Embedding initialisation while building on the meta device: the weights are
    loaded next, and the random init on meta goes through torch's reference kernels, whose
    import of torch._dynamo costs about a second of start-up."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = lambda self: None  # type: ignore[method-assign]
    nn.Embedding.reset_parameters = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved  # type: ignore[method-assign]


def load_base_model(
    model_dir: str | os.PathLike[str], precision: str = "f32", device: str = "cpu"
) -> TwinLlama:
    """Load a Llama checkpoint as a frozen (requires_grad=False), eval-mode TwinLlama."""
    from safetensors.torch import load_file

    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}", "use f32 or bf16")
    cfg = read_model_config(model_dir)
    spec = LlamaSpec.from_config(cfg, where=str(Path(model_dir) / "config.json"))
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        try:
            state.update(load_file(str(path), device="cpu"))
        except Exception as exc:  # safetensors raises its own error types
            raise ModelError(
                f"cannot read {path}: {exc}", "the weight file may be corrupt"
            ) from exc
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if spec.tie_word_embeddings and "lm_head.weight" not in state:
        state["lm_head.weight"] = state.get("model.embed_tokens.weight", torch.empty(0))
    with torch.device("meta"), _no_init():
        model = TwinLlama(spec)
    model.inv_freq = rope_inv_freq(spec)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ModelError(
            f"{model_dir}: weights do not match config.json (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})",
            "check that the checkpoint is complete",
        )
    dtype = PRECISIONS[precision]
    state = {k: v.to(dtype) for k, v in state.items()}
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise ModelError(
            f"{model_dir}: weight shapes do not match config.json",
            "check that the checkpoint is complete",
        ) from exc
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.to(device)
    model.requires_grad_(False)
    model.eval()
    return model
