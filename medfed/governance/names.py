"""The names a site policy's allow-lists may hold: medfed's algorithms and backbones.

A table of names, not an import of the registries: the registries import PyTorch, which a
SuperNode's gate must not load before it has decided on a message. A test keeps this table
equal to ``medfed.algorithms.ALGORITHMS`` and ``medfed.models.backbones.BACKBONES``.
"""

from __future__ import annotations

import difflib

__all__ = ["ALGORITHMS", "BACKBONES", "unknown_name"]

ALGORITHMS: tuple[str, ...] = (
    *("local", "fedavg", "fedprox", "fedavgft", "fedbn", "fedrep", "ditto", "feddrm"),
    *("fedals", "lora", "fedgmi", "pfedme"),
)

BACKBONES: tuple[str, ...] = (
    *("cnn", "cnn-gn", "resnet18-gn", "resnet18-bn"),
    *("tv-resnet18", "tv-resnet18-gn", "tv-resnet34", "tv-resnet34-gn"),
    *("tv-resnet50", "tv-resnet50-gn", "tv-densenet121", "tv-densenet121-gn"),
    *("tv-efficientnet-b0", "tv-efficientnet-b0-gn", "tv-mobilenet-v2", "tv-mobilenet-v2-gn"),
    *("monai3d", "monai3d-gn"),
    *("slices-cnn", "slices-cnn-gn", "slices-resnet18-gn", "slices-resnet18-bn"),
)


def unknown_name(name: str, known: tuple[str, ...], what: str) -> str | None:
    """Why ``name`` is not one of ``known`` (None when it is), with the closest names."""
    if name in known:
        return None
    if name == "auto":
        return (
            f"'auto' is no {what}: a run's auto is resolved to a {what} before the check; list "
            f"the {what}s auto may pick (medfed train --help names the defaults)"
        )
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{name!r} is no {what} medfed knows; {hint}known: {', '.join(known)}"
