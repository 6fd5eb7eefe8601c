"""twinrun's one generator: SplitMix64 and counter-based keyed streams.

A draw is keyed by what it is for — `stream(seed, "shuffle", epoch)`,
`stream(seed, "sample", step, prompt, k, position)` — never by how many draws happened before,
so prefetching, batch size, process count and resume cannot change which numbers a purpose
receives.

- `SplitMix64(seed).next_u64()`: the reference generator (state += golden gamma; output = mix).
- `stream_key(seed, purpose, *indices)`: a 64-bit key absorbed from the seed and the tagged key
  components with the SplitMix64 finaliser (`extend_key` absorbs more components into a key;
  `first_draws` draws the start of many streams at once).
- `Stream`: the SplitMix64 sequence started at that key. Draw i is `mix64(key + (i+1)*gamma)`, so
  a block of draws is computed at once (numpy, wrapping uint64 arithmetic) and any position can be
  reached without drawing what came before it.
- Uniform float64 is `(u >> 11) * 2**-53`; integers in a range are unbiased (rejection);
  permutations are Fisher–Yates; Kaiming-uniform fills need only a square root (correctly
  rounded under IEEE 754), so an init is bit-identical on any machine.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
MAX_SEED = 2**63

_U64 = np.uint64


def mix64(z: int) -> int:
    """The SplitMix64 output function (Stafford variant 13) on a Python int."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U64(30))) * _U64(_M1)
        z = (z ^ (z >> _U64(27))) * _U64(_M2)
        return z ^ (z >> _U64(31))


class SplitMix64:
    """The reference SplitMix64 generator: `state += gamma; return mix64(state)`."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + GAMMA) & MASK64
        return mix64(self.state)


KeyPart = int | str


def _words(part: KeyPart) -> list[int]:
    """A key component as tagged 64-bit words: type tag + length, then the payload."""
    if isinstance(part, bool) or not isinstance(part, int | str):
        raise TypeError(f"stream key parts must be int or str, got {type(part).__name__}")
    if isinstance(part, int):
        if not 0 <= part < 2**64:
            raise ValueError(f"stream index must be in [0, 2**64), got {part}")
        return [0x49 << 56 | 8, part & MASK64]  # 'I'
    data = part.encode("utf-8")
    padded = data + b"\0" * (-len(data) % 8)
    return (
        [0x53 << 56 | len(data)]
        + [  # 'S'
            int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8)
        ]
    )


def stream_key(seed: int, purpose: str, *indices: KeyPart) -> int:
    """The 64-bit key of the stream for (seed, purpose, *indices)."""
    check_seed(seed)
    if not isinstance(purpose, str):
        raise TypeError(f"stream purpose must be a str, got {type(purpose).__name__}")
    return extend_key(mix64(seed + GAMMA), purpose, *indices)


def extend_key(key: int, *parts: KeyPart) -> int:
    """The key of a stream whose key parts are `key`'s followed by `parts`:
    `extend_key(stream_key(seed, purpose, *a), *b) == stream_key(seed, purpose, *a, *b)`, so a
    prefix many streams share is absorbed once."""
    h = key
    for part in parts:
        for w in _words(part):
            h = mix64(((h ^ w) + GAMMA) & MASK64)
    return h


def first_draws(keys: list[int], n: int) -> np.ndarray:
    """[len(keys), n] uint64: the first n raw draws of the stream of each key — what
    `Stream(key).u64_array(n)` gives, for many streams at once."""
    with np.errstate(over="ignore"):
        counters = np.arange(1, n + 1, dtype=np.uint64) * _U64(GAMMA)
        return _mix64_array(counters[None, :] + np.array(keys, dtype=np.uint64)[:, None])


def check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")


class Stream:
    """A keyed SplitMix64 stream. `position` counts the 64-bit draws taken so far."""

    def __init__(self, key: int, position: int = 0, label: str = "") -> None:
        self.key = key & MASK64
        self.position = position
        self.label = label

    # -- raw draws ---------------------------------------------------------------------------
    def next_u64(self) -> int:
        self.position += 1
        return mix64(self.key + self.position * GAMMA)

    def u64_array(self, n: int) -> np.ndarray:
        """The next n raw draws as a uint64 array (the same numbers `next_u64` would give)."""
        if n < 0:
            raise ValueError(f"cannot draw {n} values")
        start = self.position + 1
        self.position += n
        with np.errstate(over="ignore"):
            counters = np.arange(start, start + n, dtype=np.uint64)
            return _mix64_array(counters * _U64(GAMMA) + _U64(self.key))

    # -- derived draws -----------------------------------------------------------------------
    def uniform(self) -> float:
        """A float64 in [0, 1): `(u >> 11) * 2**-53`."""
        return (self.next_u64() >> 11) * 2.0**-53

    def uniform_array(self, n: int) -> np.ndarray:
        return (self.u64_array(n) >> _U64(11)).astype(np.float64) * 2.0**-53

    def integers(self, low: int, high: int) -> int:
        """An unbiased integer in [low, high) by rejection of the short top range."""
        n = high - low
        if not 0 < n <= 1 << 64:
            raise ValueError(f"range [{low}, {high}) must hold 1 to 2**64 integers")
        limit = (1 << 64) - ((1 << 64) % n)  # largest multiple of n that fits
        while True:
            u = self.next_u64()
            if u < limit:
                return low + u % n

    def permutation(self, n: int) -> list[int]:
        """A uniformly random permutation of range(n) (Fisher–Yates, last index first)."""
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.integers(0, i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        return perm

    def choice_weighted(self, weights: list[float]) -> int:
        """An index drawn with probability proportional to `weights` (sequential float64 sum)."""
        total = math.fsum(weights)
        if not total > 0:
            raise ValueError("weights must have a positive sum")
        target = self.uniform() * total
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if target < acc:
                return i
        return max(i for i, w in enumerate(weights) if w > 0)

    def uniform_fill(self, shape: tuple[int, ...], bound: float) -> np.ndarray:
        """float64 values uniform in [-bound, bound): `(2u - 1) * bound`."""
        n = int(np.prod(shape)) if shape else 1
        u = self.uniform_array(n)
        return ((2.0 * u - 1.0) * bound).reshape(shape)

    def kaiming_uniform(self, shape: tuple[int, ...], a: float = math.sqrt(5.0)) -> np.ndarray:
        """Kaiming-uniform as torch/PEFT use it for LoRA A: bound = sqrt(6 / ((1 + a²) fan_in))
        with fan_in = shape[1]. With the default a = sqrt(5) this is sqrt(1 / fan_in)."""
        fan_in = shape[1] if len(shape) > 1 else shape[0]
        bound = math.sqrt(6.0 / ((1.0 + a * a) * fan_in))
        return self.uniform_fill(shape, bound)

    def torch_seed(self) -> int:
        """A seed for a framework generator, drawn from this stream (never used unseeded)."""
        return self.next_u64() >> 1


def stream(seed: int, purpose: str, *indices: KeyPart) -> Stream:
    """The stream for (seed, purpose, *indices); e.g. `stream(7, "shuffle", epoch)`."""
    label = "/".join(str(p) for p in (purpose, *indices))
    return Stream(stream_key(seed, purpose, *indices), label=label)


def torch_tensor(array: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A float64 draw as a torch tensor (float32 unless `dtype` says otherwise)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).to(dtype or torch.float32)


# -- framework generator state -----------------------------------------------------------------


def seed_torch(seed: int) -> int:
    """Seed torch's default generators from `stream(seed, "torch_generator")`, explicitly.

    torch seeds its default generator differently in every process; twinrun never leaves it so,
    even though its own draws never use it (a library's might)."""
    import torch

    torch_seed = stream(seed, "torch_generator").torch_seed()
    torch.manual_seed(torch_seed)
    return torch_seed


def capture_torch_rng() -> dict[str, Any]:
    """The torch CPU (and CUDA, when initialised) generator states as uint8 tensors."""
    import torch

    state: dict[str, Any] = {"cpu": torch.get_rng_state().clone()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_torch_rng(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def float_bits(x: float) -> str:
    """The float64 bit pattern as 16 hex digits (for pinned-output tests and manifests)."""
    return struct.pack(">d", x).hex()
