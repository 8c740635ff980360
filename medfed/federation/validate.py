"""Checks on a site's update before it may touch the global model."""

from __future__ import annotations

import torch

from medfed.core.errors import MedfedError

State = dict[str, torch.Tensor]


class UpdateRejected(MedfedError):
    """A site's update failed validation; the site is excluded from the round."""


def validate_update(site: str, update: State, reference: State) -> None:
    """Same keys, shapes and dtypes as ``reference``, and every value finite."""
    missing = sorted(set(reference) - set(update))
    extra = sorted(set(update) - set(reference))
    if missing or extra:
        raise UpdateRejected(
            f"update from site {site!r} has the wrong keys (missing {missing[:3]}, "
            f"unexpected {extra[:3]})"
        )
    for key, ref in reference.items():
        value = update[key]
        if value.shape != ref.shape:
            raise UpdateRejected(
                f"update from site {site!r}: {key} has shape {tuple(value.shape)}, "
                f"expected {tuple(ref.shape)}"
            )
        if value.dtype != ref.dtype:
            raise UpdateRejected(
                f"update from site {site!r}: {key} has dtype {value.dtype}, expected {ref.dtype}"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise UpdateRejected(f"update from site {site!r}: weights for {key} became NaN/inf")
