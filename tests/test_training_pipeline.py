"""The site's training loop reads nothing back per step and hands batches as the model wants
them, with the same numbers as before: the loss summed on the device equals the Python sum to
the last bit, flips by select equal the masked flips, channels-last batches equal the others."""

from __future__ import annotations

import torch

from medfed.algorithms.base import Batches, LossSum


def _batches(**kwargs) -> Batches:
    x = torch.arange(10 * 3 * 4 * 5, dtype=torch.float32).reshape(10, 3, 4, 5)
    y = torch.arange(10) % 2
    return Batches(x, y, 4, torch.Generator().manual_seed(7), **kwargs)


def test_the_loss_summed_on_the_device_is_the_python_sum_to_the_last_bit():
    losses = [torch.tensor(v, dtype=torch.float32) for v in (0.6931, 1e-8, 3.3, 0.1, 2.0 / 3)]
    expected = 0.0
    total = LossSum()

    for loss in losses:
        expected += float(loss)
        total.add(loss)

    assert total.value() == expected
    assert LossSum().value() == 0.0


def test_flips_by_select_equal_the_masked_flips_they_replace():
    flipped = _batches(augment_flip=True)
    x, y = flipped.x.clone(), flipped.y.clone()
    generator = torch.Generator().manual_seed(7)  # the draws the masked version made
    order, pos = None, 0

    for _ in range(5):  # over an epoch's end: reshuffled on the same generator
        xb, yb = flipped.next()
        if order is None or pos + 4 > 10:
            order, pos = torch.randperm(10, generator=generator), 0
        index = order[pos : pos + 4]
        pos += 4
        expected = x[index].clone()
        flip = torch.rand(4, generator=generator) < 0.5
        if bool(flip.any()):
            expected[flip] = expected[flip].flip(-1)
        assert torch.equal(xb, expected) and torch.equal(yb, y[index])


def test_channels_last_batches_hold_the_same_values():
    default, channels_last = (
        _batches(augment_flip=True),
        _batches(augment_flip=True, channels_last=True),
    )

    for _ in range(3):
        xa, ya = default.next()
        xb, yb = channels_last.next()
        assert xb.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
