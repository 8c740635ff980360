"""SecAgg+'s masks: Flower's stock generator folds its seed into 32 bits, so a masked update
falls to a search over seeds; medfed's ChaCha20 masks, expanded from the whole key, do not.
Shown on a reduced seed space (2**12 seeds), which the search covers in a moment."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("flwr")

from medfed.flower import secure  # noqa: E402, F401  (installs medfed's masks, as the apps do)
from medfed.flower.masks import (  # noqa: E402
    MASKS,
    MODULES,
    chacha20_masks,
    fold32,
    installed,
    search_seed,
    stock_masks,
)

RANGE = 2**32  # SecAgg+'s mask modulus
Q = 2**30  # its quantization range for 3 sites
LOW, HIGH = Q // 2 - 2**20, Q // 2 + 2**20  # where a round's small, clipped update lands
REDUCED = 12  # bits of the seed space searched here


def seed_folding_to(target: int, rng: np.random.Generator) -> bytes:
    """A random 32-byte seed whose XOR fold (all Flower's generator keeps of it) is ``target``."""
    head = rng.bytes(28)
    return head + (fold32(head) ^ target).to_bytes(4, "little")


def quantized_update(rng: np.random.Generator, n: int = 64) -> np.ndarray:
    return rng.integers(LOW, HIGH + 1, n, dtype=np.int64)


def test_the_search_recovers_an_update_under_the_stock_generator_and_not_under_medfeds() -> None:
    rng = np.random.default_rng(7)
    update = quantized_update(rng)
    seed = seed_folding_to(int(rng.integers(0, 2**REDUCED)), rng)

    stock = (update + stock_masks(fold32(seed), RANGE, len(update))) % RANGE
    medfed = (update + chacha20_masks(seed, RANGE, [update.shape])[0]) % RANGE

    found = search_seed(stock, RANGE, LOW, HIGH, range(2**REDUCED))
    assert found is not None and found.seed32 == fold32(seed)
    assert np.array_equal(found.update, update)
    assert search_seed(medfed, RANGE, LOW, HIGH, range(2**REDUCED)) is None


def test_medfeds_masks_depend_on_the_whole_seed_not_its_fold() -> None:
    rng = np.random.default_rng(1)
    a, b = seed_folding_to(5, rng), seed_folding_to(5, rng)
    assert fold32(a) == fold32(b) and a != b
    shapes = [(3, 4), (), (7,)]

    mask_a, again, mask_b = (chacha20_masks(s, RANGE, shapes) for s in (a, a, b))

    assert [m.shape for m in mask_a] == shapes
    assert all(m.dtype == np.int64 for m in mask_a)
    assert all(np.array_equal(x, y) for x, y in zip(mask_a, again, strict=True))
    assert not np.array_equal(mask_a[0], mask_b[0])  # same fold, different masks
    values = np.concatenate([m.ravel() for m in mask_a])
    assert values.min() >= 0 and values.max() < RANGE
    small = chacha20_masks(a, 5, [(1000,)])[0]
    assert set(np.unique(small)) == {0, 1, 2, 3, 4}  # every value of the range is drawn


def test_both_ends_of_a_medfed_run_use_medfeds_masks() -> None:
    assert installed() == MASKS
    for name in MODULES:  # where the mod and the workflow look the generator up
        assert sys.modules[name].pseudo_rand_gen is chacha20_masks


def test_masks_cancel_in_the_sum_as_secagg_needs() -> None:
    rng = np.random.default_rng(3)
    key = rng.bytes(32)
    updates = [quantized_update(rng, 16) for _ in range(2)]
    pairwise = chacha20_masks(key, RANGE, [(16,)])[0]  # both sites expand the shared key alike
    masked = [(updates[0] + pairwise) % RANGE, (updates[1] - pairwise) % RANGE]
    assert np.array_equal((masked[0] + masked[1]) % RANGE, (updates[0] + updates[1]) % RANGE)
