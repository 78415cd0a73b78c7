"""Finite-but-huge parameters of the samplers and of mixing (issue 28, class 6).

Each parameter is checked where its arithmetic happens (:func:`epoch_order`, :class:`Sampler`,
:class:`MixingSampler`, :func:`select_subset`, the asset list's ``weight``), so every caller is
covered: a value either works (a valid order, exact shares) or raises ``ValueError`` naming the
parameter, its value and the accepted range; never ``OverflowError``, ``ZeroDivisionError``, a
numpy overflow warning (an error under pytest's ``filterwarnings``) or a silently wrong order.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.asset_list import ASSET_LIST_FORMAT, parse_sources, read_asset_list
from h5forge.read.mixing import MAX_WEIGHT, MixingSampler, select_subset
from h5forge.read.multi import H5MultiDataset
from h5forge.read.order import MAX_COUNT, block_locality, epoch_order, shown
from h5forge.read.sampler import Sampler
from tests.fixtures.documents import examples

BIG = sys.float_info.max
TINY = 5e-324  # the smallest subnormal
#: Hostile finite numbers: past int64 and uint64, near and at the float maximum, subnormal.
EDGES: list[Any] = [
    0,
    -1,
    2**31,
    2**53 + 1,
    MAX_COUNT,
    MAX_COUNT + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**400,
    -(10**400),
    BIG,
    -BIG,
    1e308,
    TINY,
    1e-300,
    0.5,
    -0.0,
]
SMALL = st.integers(-2, 40)
INTS = st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from(
    [x for x in EDGES if isinstance(x, int)]
)
NUMBERS = (
    st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(10**30), 10**30)
    | st.sampled_from(EDGES)
)
POSITIVE = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False) | st.sampled_from(
    [BIG, 1e308, 1e300, TINY, 1e-300, 2**63, 2**64, 10**300, 10**400, 1, 3]
)
#: A property's settings: the profile's (a fixed seed in CI; ``make fuzz`` runs many more),
#: 30% of its example budget.
PROPERTY = settings(
    examples(30),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> H5MultiDataset:
    """Two assets of 4 and 6 samples."""
    tmp = tmp_path_factory.mktemp("ranges")
    urls = []
    for k, per in enumerate((2, 3)):
        src = tmp / f"src{k}"
        write_image_folder(src, classes=("a", "b"), per_class=per, seed=k, size=(8, 8))
        config = PackConfig(ImageConfig(resize="resize", size=(8, 8)))
        urls.append(pack(src, tmp / f"{k}.h5", config=config, workers=1).path)
    return H5MultiDataset(urls)


def _valid_mix(mix: MixingSampler, multi: H5MultiDataset) -> None:
    """Shares that sum to the length, each non-negative; a small schedule reads each asset its
    quota, inside that asset."""
    quota = mix.quota.tolist()
    assert all(q >= 0 for q in quota)
    assert sum(quota) == mix.length == len(mix)
    if mix.length <= 2000:
        got = mix.schedule(3)
        assert len(got) == mix.length
        for s, members in enumerate(mix.members):
            assert int(np.isin(got, members).sum()) == quota[s]
        assert ((got >= 0) & (got < len(multi))).all()


# --- plain tests: one per parameter family, each failing on the code before the fix ---------


def test_mixing_weights_of_any_finite_magnitude_are_shared_exactly(multi: H5MultiDataset) -> None:
    plain = MixingSampler(multi, weights=[1, 1])
    # Near the float maximum their sum overflowed to inf (OverflowError); same shares as 1:1.
    huge = MixingSampler(multi, weights=[BIG, BIG])
    assert (huge.length, huge.quota.tolist()) == (plain.length, plain.quota.tolist()) == (8, [4, 4])
    assert huge.schedule(0).tolist() == plain.schedule(0).tolist()
    # A subnormal share overflowed n / p (a RuntimeWarning); now it is a share below one draw.
    tiny = MixingSampler(multi, weights=[TINY, 1.0])
    assert (tiny.length, tiny.quota.tolist()) == (6, [0, 6])
    assert MixingSampler(multi, weights=[BIG, 1.0]).quota.tolist() == [4, 0]
    _valid_mix(tiny, multi)
    # Ints past the float maximum: math.isfinite raised OverflowError; now the documented error.
    with pytest.raises(ValueError, match=r"weights\[0\]=\(an integer of 1329 bits\) must be a "):
        MixingSampler(multi, weights=[10**400, 1])
    with pytest.raises(
        ValueError, match=r"weights\[1\]=-1e\+308 must be a finite number in \(0, 1\.79"
    ):
        MixingSampler(multi, weights=[1, -1e308])
    assert MixingSampler(multi, weights=[2**64, 2**64 * 3]).quota.tolist() == [2, 6]


def test_mixing_length_seed_and_epoch_ranges(multi: H5MultiDataset) -> None:
    # length 2**63 cast p * length past int64 (a RuntimeWarning, then negative quotas).
    with pytest.raises(
        ValueError, match=r"length=9223372036854775808 must be an integer in 1\.\.2\*\*62"
    ):
        MixingSampler(multi, weights=[1, 3], length=2**63)
    widest = MixingSampler(multi, weights=[1, 3], length=MAX_COUNT)
    assert widest.quota.tolist() == [2**60, 3 * 2**60]
    with pytest.raises(ValueError, match="length=0 must be an integer in 1..2"):
        MixingSampler(multi, length=0)
    with pytest.raises(ValueError, match="seed=-1 must be an integer >= 0"):
        MixingSampler(multi, seed=-1)
    mix = MixingSampler(multi, seed=10**400)  # any seed, any epoch: numpy takes any int
    mix.set_epoch(2**200)
    _valid_mix(mix, multi)
    assert len(list(mix)) == mix.length
    with pytest.raises(ValueError, match="epoch=-1 must be an integer >= 0"):
        mix.set_epoch(-1)


def test_an_asset_list_weight_past_the_float_maximum_is_refused(tmp_path: Path) -> None:
    listed = tmp_path / "assets.json"
    body = {"format": ASSET_LIST_FORMAT, "version": 1, "assets": [{"url": "a.h5", "weight": 0}]}
    text = json.dumps(body).replace('"weight": 0', '"weight": 1' + "0" * 400)
    listed.write_text(text)
    with pytest.raises(ValueError, match=r"assets\.json: assets\[0\]: weight \(an integer of 1329"):
        read_asset_list(
            Location(str(listed))
        )  # was OverflowError: int too large to convert to float
    with pytest.raises(ValueError, match=r"sources\[0\]: weight \(an integer of 1329 bits\)"):
        parse_sources([{"url": "a.h5", "weight": 10**400}])
    assert parse_sources([{"url": "a.h5", "weight": TINY}])[0].weight == TINY
    assert parse_sources([{"url": "a.h5", "weight": BIG}])[0].weight == BIG


def test_sampler_counts_past_int64_are_refused() -> None:
    # epoch_order(2**63) returned an empty order; len(Sampler(2**70)) raised OverflowError.
    with pytest.raises(
        ValueError, match=r"n=9223372036854775808 must be an integer in 0\.\.2\*\*62"
    ):
        epoch_order(2**63)
    with pytest.raises(ValueError, match=r"a length must be an int in 0\.\.2\*\*62"):
        Sampler(2**70, rank=0, world_size=1)
    assert len(Sampler(MAX_COUNT, rank=0, world_size=1)) == MAX_COUNT  # no order built yet
    # world_size 2**63 overflowed int64 positions (OverflowError) on the first iteration.
    with pytest.raises(
        ValueError, match=r"world_size=9223372036854775808 must be an integer in 1\.\.2\*\*62"
    ):
        Sampler(10, rank=0, world_size=2**63)
    last = MAX_COUNT - 1  # padded by wrapping: every rank gets ceil(10 / 2**62) = 1 sample
    assert list(Sampler(10, rank=last, world_size=MAX_COUNT, shuffle=False)) == [last % 10]
    assert list(Sampler(10, rank=last, world_size=MAX_COUNT, exact=True)) == []
    assert list(Sampler(10, rank=3, world_size=MAX_COUNT, shuffle=False)) == [3]
    with pytest.raises(ValueError, match="world_size=0 must be an integer in 1"):
        Sampler(10, rank=0, world_size=0)
    with pytest.raises(
        ValueError, match=r"block_size=1180591620717411303424 must be an integer in 1\.\.2\*\*62"
    ):
        Sampler(10, block_size=2**70, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"block_size=\(an integer of 1329 bits\) must be"):
        block_locality(np.arange(4), 2, 10**400)  # was OverflowError in the int64 division
    with pytest.raises(ValueError, match=r"start=11 must be an integer in 0\.\.10"):
        Sampler(10, rank=0, world_size=1).indices(0, start=11)


def test_sampler_seeds_and_epochs_of_any_size_work() -> None:
    sampler = Sampler(10, seed=10**400, rank=0, world_size=2)
    sampler.set_epoch(2**100)
    first = list(sampler)
    assert sorted(first) == sorted(set(first))
    assert len(first) == 5
    state = {**sampler.state_dict(), "epoch": 10**300, "position": 4}
    sampler.load_state_dict(state)
    assert len(list(sampler)) == 3


def test_subset_parameters_are_checked_before_their_arithmetic() -> None:
    # subset=1e308 overflowed round(subset * total); a uint64 index wrapped to a negative one.
    with pytest.raises(
        ValueError, match=r"subset=1e\+308 of 10 samples: give a fraction in \(0, 1\]"
    ):
        select_subset(1e308, 10, seed=0)
    with pytest.raises(ValueError, match=r"subset=nan of 10 samples: give a fraction in \(0, 1\]"):
        select_subset(float("nan"), 10, seed=0)
    with pytest.raises(ValueError, match="subset=5e-324 of 10 samples selects none"):
        select_subset(TINY, 10, seed=0)
    with pytest.raises(ValueError, match="subset index 9223372036854775808 out of range"):
        select_subset([2**63], 10, seed=0)
    with pytest.raises(ValueError, match=r"subset index \(an integer of 1329 bits\) out of range"):
        select_subset([1, 10**400], 10, seed=0)
    with pytest.raises(ValueError, match="seed=-1 must be an integer >= 0"):
        select_subset(0.5, 10, seed=-1)
    half = select_subset(0.5, 10, seed=10**400).tolist()
    assert half == select_subset(0.5, 10, seed=10**400).tolist()
    assert len(half) == 5


# --- properties: any finite number in a generous range works or is the documented error ----


def _taken(call: Any) -> Any:
    """``call()``, or None when it raised the documented ValueError, which names what it
    refuses (any other exception, warnings included, fails the property)."""
    try:
        value = call()
    except ValueError as e:
        error = str(e)
    else:
        event("taken")
        return value
    event("refused")
    assert "=" in error or "subset" in error or "weight" in error, error
    return None


@PROPERTY
@given(
    weights=st.none() | st.lists(POSITIVE | NUMBERS, min_size=2, max_size=2),
    length=st.none() | st.integers(1, 3000) | INTS,
    seed=SMALL | INTS,
    epoch=SMALL | INTS,
)
def test_any_mixing_parameters_give_exact_shares_or_value_error(
    multi: H5MultiDataset, weights: Any, length: Any, seed: Any, epoch: Any
) -> None:
    mix = _taken(lambda: MixingSampler(multi, weights=weights, length=length, seed=seed))
    if mix is None:
        return
    if length is None:  # the longest epoch in which no asset repeats a sample
        assert all(q <= len(m) for q, m in zip(mix.quota.tolist(), mix.members, strict=True))
        assert mix.length <= len(multi)
    _valid_mix(mix, multi)
    if epoch < 0:
        with pytest.raises(
            ValueError, match=re.escape(f"epoch={shown(epoch)} must be an integer >= 0")
        ):
            mix.set_epoch(epoch)
    elif mix.length <= 2000:
        mix.set_epoch(epoch)
        assert len(list(mix)) == mix.length


@PROPERTY
@given(
    n=st.integers(0, 60) | INTS,
    place=st.integers(1, 8).flatmap(lambda w: st.tuples(st.integers(0, w - 1), st.just(w)))
    | st.tuples(SMALL | INTS, SMALL | INTS),
    seed=st.integers(0, 2**70) | INTS,
    block_size=st.none() | st.integers(1, 16) | INTS,
    window=st.integers(1, 8) | INTS,
    epoch=st.integers(0, 2**70) | INTS,
)
def test_any_sampler_parameters_give_an_order_or_value_error(
    n: int, place: tuple[int, int], seed: int, block_size: Any, window: int, epoch: int
) -> None:
    rank, world_size = place
    sampler = _taken(
        lambda: Sampler(
            n, rank=rank, world_size=world_size, seed=seed, block_size=block_size, window=window
        )
    )
    if sampler is None:
        return
    assert 0 <= len(sampler) <= sys.maxsize
    if epoch < 0:
        with pytest.raises(
            ValueError, match=re.escape(f"epoch={shown(epoch)} must be an integer >= 0")
        ):
            sampler.set_epoch(epoch)
        return
    if n > 1000:  # a valid sampler; its order would not fit in memory
        return
    sampler.set_epoch(epoch)
    expected = len(sampler)
    got = list(sampler)
    assert len(got) == expected
    assert all(0 <= i < n for i in got)
    assert sampler.state_dict()["epoch"] == epoch + 1


@PROPERTY
@given(epoch=SMALL | INTS, position=SMALL | INTS, n=st.sampled_from([0, 3, 10]))
def test_any_sampler_state_numbers_load_or_raise_value_error(
    epoch: int, position: int, n: int
) -> None:
    sampler = Sampler(n, rank=1, world_size=2)
    state = {**sampler.state_dict(), "epoch": epoch, "position": position}
    if not (epoch >= 0 and 0 <= position <= n):
        with pytest.raises(ValueError, match=r"(epoch|position)=.+ must be an int"):
            sampler.load_state_dict(state)
        return
    sampler.load_state_dict(state)
    assert all(0 <= i < n for i in sampler)


@PROPERTY
@given(
    subset=st.floats(0, 1)
    | NUMBERS.filter(lambda x: isinstance(x, float))
    | st.lists(st.integers(-1, 11) | INTS, max_size=4),
    seed=INTS,
)
def test_any_subset_selects_indices_or_raises_value_error(subset: Any, seed: int) -> None:
    picks = _taken(lambda: select_subset(subset, 10, seed=seed))
    if picks is None:
        return
    assert picks.dtype == np.int64
    assert ((picks >= 0) & (picks < 10)).all()


@PROPERTY
@given(weight=POSITIVE | NUMBERS)
def test_any_asset_list_weight_is_taken_as_a_finite_float_or_refused(weight: Any) -> None:
    found = _taken(lambda: parse_sources([{"url": "a.h5", "weight": weight}]))
    if found is None:
        assert not (isinstance(weight, (int, float)) and 0 < weight <= MAX_WEIGHT)
        return
    assert 0 < found[0].weight <= MAX_WEIGHT
    assert found[0].weight == float(weight)
