"""The diag hook's hand-over copies: float32 CPU leaves share one flat buffer, anything else is
cloned part by part; either way the row gets the bytes the leaves held when they were copied."""

from __future__ import annotations

import torch

from twinrun.core.tiles import tiled
from twinrun.diag.checksum import checksum_digest_many
from twinrun.diag.flat import FlatLeaf, FlatLeaves
from twinrun.diag.recorder import leaf_value
from twinrun.train.hooks.diag import copied


def test_float32_leaves_share_one_buffer_and_others_are_cloned() -> None:
    g = torch.Generator().manual_seed(5)
    lora = [torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g)]
    params = [torch.nn.Parameter(t.clone()) for t in lora]
    leaves = [
        lora,
        [t.double() for t in lora],  # float64: cloned
        [],  # no parts (no optimizer state yet): hashed as an empty array, as before
        params,
    ]
    want = [leaf_value(list(parts)) for parts in leaves]
    out = copied(leaves)
    assert isinstance(out[0], FlatLeaf) and isinstance(out[3], FlatLeaf)
    assert out[0].group is out[3].group  # one copy for both
    assert isinstance(out[1], list) and out[2] == []
    for parts in leaves:  # the next step updates in place: the copies keep the old bytes
        for t in parts:
            t.data.mul_(2.0)
    assert [leaf_value(v) for v in out] == want
    assert leaf_value(out[0]).checksum == checksum_digest_many(lora)[0] / 4


def lora_leaves(seed: int, tile: bool) -> list[list[torch.Tensor]]:
    """Four leaves of one length (as the LoRA gradients, moments and parameters), each tiled in
    a buffer of its own or as separate tensors."""
    g = torch.Generator().manual_seed(seed)
    leaves = [[torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g),
               torch.randn(8, 33, generator=g)] for _ in range(4)]  # fmt: skip
    return [tiled(parts) for parts in leaves] if tile else leaves


def test_tiled_leaves_are_read_in_place_with_the_values_of_a_copy() -> None:
    leaves = lora_leaves(7, tile=True)
    want = [leaf_value(list(parts)) for parts in leaves]  # the general multi-part path
    out = copied(leaves, copy=False)
    group = out[0].group  # type: ignore[union-attr]
    assert group.spans is not None and group.flat is None  # nothing copied: read in place
    assert [t.data_ptr() for t in group.spans] == [parts[0].data_ptr() for parts in leaves]
    assert all(isinstance(v, FlatLeaf) and v.group is group for v in out)
    assert [leaf_value(v) for v in out] == want
    assert [leaf_value(v) for v in copied(lora_leaves(7, tile=False), copy=False)] == want


def test_leaves_that_do_not_tile_are_copied() -> None:
    leaves = lora_leaves(8, tile=True)
    leaves[2][1] = leaves[2][1].clone()  # one part moved out of its buffer
    want = [leaf_value(list(parts)) for parts in leaves]
    out = copied(leaves, copy=False)
    assert out[0].group.spans is None  # type: ignore[union-attr]
    assert [leaf_value(v) for v in out] == want
    assert FlatLeaves.over_tiles(leaves) is None
    assert FlatLeaves.over_tiles(lora_leaves(8, tile=True)) is not None
