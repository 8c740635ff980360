"""Weights a site already holds, named by their hash instead of sent again.

A site keeps the global weights it last validated (float32, lossless). A later message whose
weights the site can rebuild from them (the next round's training, the finishing) names their
sha256 instead of carrying them; a site that then cannot rebuild them is sent them once.
"""

from __future__ import annotations

import hashlib
from typing import Any

from medfed.federation import wire


def lossless_subset(payload: bytes, keys: list[str]) -> bytes:
    """``keys`` of a validated float32 ``payload``, as a site that holds it rebuilds them
    (empty: none to rebuild)."""
    try:
        return wire.lossless_subset(payload, keys) if payload else b""
    except wire.WireError:  # keys the global state does not hold
        return b""


class ValidatedWeights:
    """The global weights of the last validation, as sent, and the sites that hold them."""

    def __init__(self) -> None:
        self.payload = b""
        self.holds: set[str] = set()

    def sending(self) -> None:
        """New weights go out with a validation: no site holds them until it answers."""
        self.holds = set()

    def validated(self, payload: bytes, sites: set[str]) -> None:
        """``sites`` validated ``payload`` and keep it."""
        self.payload, self.holds = payload, set(sites)

    def subset(self, keys: list[str]) -> bytes:
        """The validated weights' ``keys``, as a site that holds them rebuilds them."""
        return lossless_subset(self.payload, keys)

    def offer(
        self,
        site: str,
        step: dict[str, Any],
        payload: bytes,
        validated_subset: bytes,
        holds: bool | None = None,
    ) -> tuple[dict[str, Any], bytes, int]:
        """What a message for ``site`` carries for ``payload``, the weights: when they are
        ``validated_subset`` (the validated weights' own keys, as the site rebuilds them) and
        the site holds the validated weights (``holds``; by default: it validated the last
        ones), their hash goes instead. The step, the payload to send, and the bytes the site
        then rebuilds rather than receives."""
        if holds is None:
            holds = site in self.holds
        if payload and payload == validated_subset and holds:
            digest = hashlib.sha256(payload).hexdigest()
            return step | {"reuse_validated": digest}, b"", len(payload)
        return step, payload, 0

    def to_resend(self, failed: list[str]) -> list[str]:
        """The sites of ``failed`` that were sent the hash of weights they held: they get the
        weights themselves, once (their copy may be gone or damaged)."""
        again = [site for site in failed if site in self.holds]
        self.holds -= set(again)
        return again
