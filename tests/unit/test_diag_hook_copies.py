"""The diag hook's hand-over copies: float32 CPU leaves share one flat buffer, anything else is
cloned part by part; either way the row gets the bytes the leaves held when they were copied."""

from __future__ import annotations

import torch

from twinrun.diag.checksum import checksum_digest_many
from twinrun.diag.flat import FlatLeaf
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
