"""A deterministic prioritized replay buffer (Schaul et al., 2016, proportional variant).

Past rollouts re-enter later GRPO batches with probability proportional to their priority

    p_i  = (|A_i| + priority_eps) ** alpha            P(i) = p_i / sum_j p_j

and carry the importance weight

    w_i  = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta  =  (p_min / p_i) ** beta

where N is the number of items in the buffer and the max runs over the *whole buffer* (attained at
its smallest positive priority p_min), as in Schaul et al. — so a weight does not depend on which
other items were drawn alongside it, and every weight is in (0, 1]. The right-hand form is the
same quantity with N and the total cancelled, so it needs fewer roundings.

Why the sum tree is deterministic. `SumTree` is a complete binary tree stored in one array: leaves
at [size, size + capacity), node i = node 2i + node 2i+1, root at 1. Updating a leaf recomputes
every node on its path to the root *from its two children* (never `node += delta`). By induction
each node is a fixed function (one IEEE-754 addition in a fixed left-right order) of the current
values of its two children, so every node — and the total — is a function of the current leaf
priorities alone: the same bits whatever order, timing or history of updates produced them. An
incremental `+= delta` tree would instead carry rounding from every past update.

Draws. Draw i of a `sample` call takes u_i = `rng_for_i(i)` in [0, 1) — in GRPO
`stream(seed, "replay", step, i).uniform()` — and descends the tree to the slot whose prefix-sum
interval [sum_{j<s} p_j, sum_{j<=s} p_j) contains u_i * total (left when target < left sum, else
subtract the left sum and go right; a zero-sum subtree is never entered). Draws are with
replacement and each depends only on its own u_i.

Exponents use Python's `**` (the platform libm `pow`): bit-identical run to run on one machine;
alpha = 1 and beta = 1 are exact everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEFAULT_PRIORITY_EPS = 1e-6


class SumTree:
    """Float64 priorities in a fixed-shape binary tree; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"sum tree capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        size = 1
        while size < capacity:
            size *= 2
        self._size = size
        self._nodes: list[float] = [0.0] * (2 * size)

    def __len__(self) -> int:
        return self.capacity

    @property
    def total(self) -> float:
        return self._nodes[1]

    def get(self, slot: int) -> float:
        self._check_slot(slot)
        return self._nodes[self._size + slot]

    def leaves(self) -> list[float]:
        return self._nodes[self._size : self._size + self.capacity]

    def set(self, slot: int, priority: float) -> None:
        """Set a leaf and recompute each node on its root path from its two children."""
        self._check_slot(slot)
        priority = float(priority) + 0.0  # -0.0 -> +0.0: a leaf's bits depend on its value only
        if not (math.isfinite(priority) and priority >= 0.0):
            raise ValueError(f"priority must be finite and >= 0, got {priority}")
        i = self._size + slot
        self._nodes[i] = priority
        i //= 2
        while i >= 1:
            self._nodes[i] = self._nodes[2 * i] + self._nodes[2 * i + 1]
            i //= 2

    def find(self, target: float) -> int:
        """The slot whose prefix-sum interval holds `target` (0 <= target, clamped to the last
        positive leaf when rounding puts it at or past the total)."""
        if not self.total > 0.0:
            raise ValueError("cannot sample from a sum tree whose total priority is 0")
        if not target >= 0.0:
            raise ValueError(f"target must be >= 0, got {target}")
        nodes = self._nodes
        i = 1
        while i < self._size:
            left = 2 * i
            left_sum = nodes[left]
            if target < left_sum or not nodes[left + 1] > 0.0:
                i = left
            else:
                target -= left_sum
                i = left + 1
        return i - self._size

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} out of range [0, {self.capacity})")


class PrioritizedReplay(Generic[T]):
    """A ring buffer of `capacity` items with proportional prioritized sampling."""

    def __init__(
        self,
        capacity: int,
        alpha: float,
        beta: float,
        priority_eps: float = DEFAULT_PRIORITY_EPS,
    ) -> None:
        if not (math.isfinite(alpha) and alpha >= 0.0):
            raise ValueError(f"replay alpha must be finite and >= 0, got {alpha}")
        if not (math.isfinite(beta) and beta >= 0.0):
            raise ValueError(f"replay beta must be finite and >= 0, got {beta}")
        if not (math.isfinite(priority_eps) and priority_eps >= 0.0):
            raise ValueError(f"replay priority_eps must be finite and >= 0, got {priority_eps}")
        self.tree = SumTree(capacity)
        self.capacity = capacity
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.priority_eps = float(priority_eps)
        self._items: list[T | None] = [None] * capacity
        self._size = 0
        self._next = 0  # the slot the next `add` writes: the oldest once the buffer is full

    def __len__(self) -> int:
        return self._size

    def priority(self, abs_advantage: float) -> float:
        """(|A| + priority_eps) ** alpha."""
        a = abs(float(abs_advantage))
        if not math.isfinite(a):
            raise ValueError(f"advantage must be finite, got {abs_advantage}")
        return (a + self.priority_eps) ** self.alpha

    def add(self, item: T, priority_abs_advantage: float) -> int:
        """Store `item` in the next ring slot (overwriting the oldest when full); returns it."""
        slot = self._next
        self._items[slot] = item
        self.tree.set(slot, self.priority(priority_abs_advantage))
        self._next = (slot + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)
        return slot

    def update(self, slot: int, priority_abs_advantage: float) -> None:
        """Re-prioritise a stored item (e.g. with the advantage it got when replayed)."""
        if not 0 <= slot < self._size:
            raise IndexError(f"slot {slot} holds no item (buffer has {self._size})")
        self.tree.set(slot, self.priority(priority_abs_advantage))

    def item(self, slot: int) -> T:
        if not 0 <= slot < self._size:
            raise IndexError(f"slot {slot} holds no item (buffer has {self._size})")
        return self._items[slot]  # type: ignore[return-value]  # slots below _size are filled

    def probabilities(self) -> list[float]:
        """P(i) = p_i / total for every stored slot, in slot order."""
        total = self.tree.total
        if not total > 0.0:
            raise ValueError("replay buffer has no positive priority")
        return [p / total for p in self.tree.leaves()[: self._size]]

    def weight(self, slot: int) -> float:
        """Importance weight (p_min / p_slot) ** beta, normalised over the whole buffer."""
        p = self.tree.get(slot)
        if not p > 0.0:
            raise ValueError(f"slot {slot} has priority 0: it is never sampled and has no weight")
        return (self._min_priority() / p) ** self.beta

    def _min_priority(self) -> float:
        positive = [p for p in self.tree.leaves()[: self._size] if p > 0.0]
        if not positive:
            raise ValueError("replay buffer has no positive priority")
        return min(positive)

    def sample(self, k: int, rng_for_i: Callable[[int], float]) -> list[tuple[int, T, float]]:
        """k draws with replacement: draw i descends to u_i * total with u_i = rng_for_i(i).

        Returns [(slot, item, weight)] in draw order (the slots are the leaf
        `replay.sample_indices`).
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"sample size must be an integer >= 0, got {k!r}")
        if k == 0:
            return []
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        total = self.tree.total
        p_min = self._min_priority()
        out: list[tuple[int, T, float]] = []
        for i in range(k):
            u = float(rng_for_i(i))
            if not 0.0 <= u < 1.0:
                raise ValueError(f"draw {i}: uniform must be in [0, 1), got {u}")
            slot = self.tree.find(u * total)
            weight = (p_min / self.tree.get(slot)) ** self.beta
            out.append((slot, self._items[slot], weight))  # type: ignore[arg-type]  # a drawn slot is filled
        return out

    def priorities(self) -> list[float]:
        """The priority of every stored slot, in slot order (the tree's leaves in use)."""
        return self.tree.leaves()[: self._size]

    def sample_traced(
        self, k: int, rng_for_i: Callable[[int], float]
    ) -> tuple[list[tuple[int, T, float]], list[float]]:
        """`sample`, and the uniforms u_i its draws took, in draw order (for diagnostics)."""
        us: list[float] = []

        def traced(i: int) -> float:
            u = float(rng_for_i(i))
            us.append(u)
            return u

        return self.sample(k, traced), us

    # -- checkpoint/resume -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: priorities, items, ring position (items as given)."""
        return {
            "capacity": self.capacity,
            "alpha": self.alpha,
            "beta": self.beta,
            "priority_eps": self.priority_eps,
            "size": self._size,
            "next": self._next,
            "priorities": self.tree.leaves()[: self._size],
            "items": list(self._items[: self._size]),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrioritizedReplay[Any]:
        """Rebuild a buffer; the tree is bitwise the one saved (it depends only on its leaves)."""
        buf: PrioritizedReplay[Any] = cls(
            state["capacity"], state["alpha"], state["beta"], state["priority_eps"]
        )
        for slot, (item, p) in enumerate(zip(state["items"], state["priorities"], strict=True)):
            buf._items[slot] = item
            buf.tree.set(slot, p)
        buf._size = state["size"]
        buf._next = state["next"]
        return buf
