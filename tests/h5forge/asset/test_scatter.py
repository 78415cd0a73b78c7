"""A remote run's bytes copied to its samples' buffers straight from the blocks that hold them
(h5forge.asset.ranges._scatter): no copy of the run of its own, the same bytes as one."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from h5forge.asset.ranges import _scatter


@given(
    seed=st.integers(0, 2**32 - 1),
    run=st.integers(1, 4000),
    cuts=st.integers(0, 6),
    members=st.integers(1, 12),
)
def test_scatter_copies_each_sample_from_the_views_that_hold_it(
    seed: int, run: int, cuts: int, members: int
) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(run)
    # The run as the reader holds it: consecutive views (kept blocks, fetched spans), some of
    # them views into larger objects, as blocks are.
    at = sorted(rng.sample(range(1, run), min(cuts, run - 1)))
    views = []
    for a, b in zip([0, *at], [*at, run], strict=True):
        pad = rng.randbytes(rng.randint(0, 3))
        views.append(memoryview(pad + data[a:b] + pad)[len(pad) : len(pad) + b - a])
    # Its samples: adjacent ranges that cover it, in order (how read_into groups a run).
    bounds = sorted({0, run, *rng.sample(range(1, run), min(members - 1, run - 1))})
    buffers = [memoryview(bytearray(b - a)) for a, b in zip(bounds, bounds[1:], strict=False)]
    _scatter(views, list(zip(bounds, buffers, strict=False)))
    for a, b, buf in zip(bounds, bounds[1:], buffers, strict=False):
        assert bytes(buf) == data[a:b]
