"""SecAgg+'s masks expanded from the whole shared key, with a cryptographic generator.

Flower 1.42's SecAgg+ expands every mask (a site's private mask and each pairwise one) with
``secaggplus_utils.pseudo_rand_gen``, which XOR-folds its seed (a 32-byte random seed, or a
32-byte key agreed by ECDH, base64-encoded) into 32 bits and seeds numpy's Mersenne Twister with
that: whoever sees a masked update can try all 2**32 seeds, and a seed is confirmed when the
update it leaves lies in the quantization range (:func:`search_seed`). medfed writes both the
ServerApp and the ClientApp, so both ends use :func:`chacha20_masks` instead: the mask is the
ChaCha20 keystream (``cryptography``) under the key SHA-256(domain, whole seed), so guessing it
means guessing the whole key. Flower's protocol messages are unchanged; :func:`install` sets the
generator in Flower's client mod and server workflow, and every secure training message names
the generator (:data:`MASKS`), which a site checks before it masks anything.

:func:`measure_search` times the stock generator's seed search on this machine (seeds per
second, and so the hours 2**32 seeds take); docs/privacy.md's threat model gives its figures.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

MASKS = "chacha20-sha256-v1"
"""The mask generator's name, as every secure training message carries it."""
_DOMAIN = b"medfed secagg+ masks v1\x00"
CLIENT_SIDE = "flwr.client.mod.secure_aggregation.secaggplus_mod"
SERVER_SIDE = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
MODULES = (CLIENT_SIDE, SERVER_SIDE)
"""Where Flower's SecAgg+ looks its mask generator up, on a SuperNode and on the server."""


def chacha20_masks(
    seed: bytes, num_range: int, dimensions_list: Sequence[tuple[int, ...]]
) -> list[np.ndarray]:
    """Masks of the given shapes, uniform in ``[0, num_range)`` (int64), from the whole
    ``seed``: the same signature as Flower's ``pseudo_rand_gen``, for either end of SecAgg+."""
    if num_range < 2:
        raise ValueError(f"num_range must be at least 2, got {num_range}")
    sizes = [math.prod(d) if len(d) else 1 for d in dimensions_list]
    key = hashlib.sha256(_DOMAIN + bytes(seed)).digest()
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * sum(sizes))), dtype="<u8")
    # 64 random bits reduced mod num_range (<= 2**32): a bias below 2**-32, unusable.
    values = (words % np.uint64(num_range)).astype(np.int64)
    out, start = [], 0
    for dims, size in zip(dimensions_list, sizes, strict=True):
        part = values[start : start + size]
        out.append(np.array(part[0], dtype=np.int64) if not len(dims) else part.reshape(dims))
        start += size
    return out


def install() -> None:
    """Have Flower's SecAgg+ (the SuperNode's mod and the server's workflow) expand its masks
    with :func:`chacha20_masks`: both ends of a medfed run, since medfed starts both apps."""
    for module in MODULES:
        # The modules themselves (a package re-exports the mod function under the same name).
        importlib.import_module(module).pseudo_rand_gen = chacha20_masks


def installed() -> str:
    """The generator Flower's client mod expands masks with now (:data:`MASKS`, or ``stock``)."""
    ours = [importlib.import_module(m).pseudo_rand_gen is chacha20_masks for m in MODULES]
    return MASKS if all(ours) else "stock"


# ---------------------------------------------------------------------------- the seed search
def fold32(seed: bytes) -> int:
    """The 32-bit seed Flower's stock generator folds ``seed`` into."""
    folded = 0
    for i in range(0, len(seed), 4):
        folded ^= int.from_bytes(seed[i : i + 4], "little")
    return folded


def stock_masks(seed32: int, num_range: int, n: int) -> np.ndarray:
    """The first ``n`` values of the stock generator's mask for the 32-bit seed ``seed32``."""
    return np.random.RandomState(seed32).randint(0, num_range - 1, n, dtype=np.int64)


@dataclass(frozen=True)
class Found:
    seed32: int
    update: np.ndarray  # the masked values with the mask taken off


def search_seed(
    masked: np.ndarray, num_range: int, low: int, high: int, seeds: range, probe: int = 8
) -> Found | None:
    """Try each 32-bit seed of ``seeds`` against a masked update (values mod ``num_range``)
    whose unmasked values lie in ``[low, high]``: a seed is confirmed when the first ``probe``
    values it unmasks all do (a wrong seed passes each with chance (high - low + 1) /
    num_range), then every value is unmasked with it. None: no seed of ``seeds`` fits."""
    head = np.asarray(masked[:probe], dtype=np.int64)
    for seed32 in seeds:
        candidate = (head - stock_masks(seed32, num_range, len(head))) % num_range
        if bool(((candidate >= low) & (candidate <= high)).all()):
            values = np.asarray(masked, dtype=np.int64)
            full = (values - stock_masks(seed32, num_range, len(values))) % num_range
            if bool(((full >= low) & (full <= high)).all()):
                return Found(seed32, full)
    return None


@dataclass(frozen=True)
class SearchSpeed:
    seeds: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.seeds / self.seconds

    @property
    def hours_for_all(self) -> float:
        """Hours one core takes to try all 2**32 seeds."""
        return 2**32 / self.per_second / 3600


def measure_search(seconds: float = 5.0, num_range: int = 2**32) -> SearchSpeed:
    """Seeds per second of :func:`search_seed` on one core of this machine, over about
    ``seconds`` (a masked vector that no tried seed fits, so every seed is tried in full)."""
    rng = np.random.default_rng(0)
    masked = rng.integers(0, num_range, 8, dtype=np.int64)
    # Bounds no value can meet: every seed is tried, none is confirmed.
    tried, start, chunk = 0, time.perf_counter(), 2000
    while time.perf_counter() - start < seconds:
        search_seed(masked, num_range, num_range, num_range, range(tried, tried + chunk))
        tried += chunk
    return SearchSpeed(tried, time.perf_counter() - start)
