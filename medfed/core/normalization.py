"""Site normalization: per-channel statistics of a site's training split, applied batch by
batch as the model reads (:class:`NormalizedView`).

A leaf (torch and numpy only): data builds the views, while models and algorithms read them
without importing the data layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_CHUNK_VALUES = 1 << 22  # values per chunk when statistics run over a stored split

# The input normalization torchvision's ImageNet weights expect (the values of
# ``ResNet18_Weights.IMAGENET1K_V1.transforms()``; a test checks them against torchvision, and
# keeping them as constants spares every import the cost of torchvision's).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Normalization:
    """Per-channel mean/std of a site's training split, applied to every split of that site."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def identity(cls, channels: int) -> Normalization:
        return cls(mean=(0.0,) * channels, std=(1.0,) * channels)

    @classmethod
    def fit(cls, x: torch.Tensor) -> Normalization:
        """Statistics over a (N, C, ...) training tensor (any dtype; summed in float64)."""
        if x.shape[0] == 0:
            raise ValueError("cannot compute site normalization from an empty training split")
        return cls.pooled([cls.moments(x)], minimum=1)

    @staticmethod
    def moments(x: torch.Tensor) -> dict[str, list[float]]:
        """Per-channel count, sum and sum of squares of a (N, C, ...) training tensor: what a
        site shares for a federation-wide normalization (aggregates, never scans).

        Summed a few rows at a time, so a stored float16 split never exists in float64 whole.
        """
        channels = x.shape[1] if x.dim() > 1 else 0
        dims = [0, *range(2, x.dim())]
        total = torch.zeros(channels, dtype=torch.float64)
        squares = torch.zeros(channels, dtype=torch.float64)
        rows = max(1, _CHUNK_VALUES // max(1, x[0].numel())) if x.shape[0] else 1
        for start in range(0, x.shape[0], rows):
            xd = x[start : start + rows].double()
            total += xd.sum(dim=dims).cpu()
            squares += (xd * xd).sum(dim=dims).cpu()
        count = float(x.numel() // channels) if channels else 0.0
        return {"count": [count] * channels, "sum": total.tolist(), "sumsq": squares.tolist()}

    @classmethod
    def pooled(cls, moments: list[dict[str, list[float]]], minimum: int = 2) -> Normalization:
        """Mean and (unbiased) std of every site's training values together, from each site's
        :meth:`moments`: the same figures as :meth:`fit` on the pooled tensors."""
        count = np.sum([m["count"] for m in moments], axis=0)
        if np.any(count < minimum):
            raise ValueError("a federation-wide normalization needs at least two training values")
        total = np.sum([m["sum"] for m in moments], axis=0)
        squares = np.sum([m["sumsq"] for m in moments], axis=0)
        mean = total / count
        var = np.maximum(squares - count * mean**2, 0.0) / np.maximum(count - 1, 1)
        std = np.maximum(np.sqrt(var), 1e-6)
        return cls(mean=tuple(float(v) for v in mean), std=tuple(float(v) for v in std))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (N, C, ...) normalized, in float32 (float64 stays float64), on ``x``'s device."""
        x = x if x.dtype == torch.float64 else x.float()
        mean, std = self._constants(x.dim(), x.dtype, x.device)
        return (x - mean) / std

    def _constants(
        self, dims: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1) + (1,) * (dims - 2)
        mean = torch.tensor(self.mean, dtype=dtype, device=device).view(shape)
        std = torch.tensor(self.std, dtype=dtype, device=device).view(shape)
        return mean, std

    def view(self, stored: torch.Tensor) -> NormalizedView:
        """``stored`` (N, C, ...) seen through this normalization, one batch at a time."""
        return NormalizedView(stored, self)

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_dict(cls, data: dict[str, list[float]]) -> Normalization:
        return cls(mean=tuple(data["mean"]), std=tuple(data["std"]))


class NormalizedView:
    """A site's stored scans (N, C, ...) as the model reads them: normalized batch by batch.

    Indexing rows (an int, a slice, an index tensor or list) returns a new float32 tensor of
    normalized scans; nothing but the stored tensor is kept, so a split is held once, in its
    storage dtype. ``to``/``pin_memory`` move the stored tensor (still in its storage dtype),
    and normalization then runs on that device. Any other torch function given a view gets the
    whole split normalized (a transient copy), so a view can stand in for a tensor anywhere.
    """

    __slots__ = ("stored", "normalization", "_mean", "_std")

    def __init__(self, stored: torch.Tensor, normalization: Normalization) -> None:
        if stored.dim() < 2:
            raise ValueError(f"a stored split is (N, C, ...), got shape {tuple(stored.shape)}")
        self.stored = stored
        self.normalization = normalization
        self._mean, self._std = normalization._constants(stored.dim(), self.dtype, stored.device)

    @property
    def shape(self) -> torch.Size:
        return self.stored.shape

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of what indexing returns (float32, or float64 for a float64 store)."""
        return torch.float64 if self.stored.dtype == torch.float64 else torch.float32

    @property
    def device(self) -> torch.device:
        return self.stored.device

    def __len__(self) -> int:
        return int(self.stored.shape[0])

    def dim(self) -> int:
        return self.stored.dim()

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.stored.size() if dim is None else self.stored.size(dim)

    def __getitem__(self, index: int | slice | torch.Tensor | list[int]) -> torch.Tensor:
        if isinstance(index, tuple):
            raise TypeError("a NormalizedView is indexed by rows (scans) only")
        if isinstance(index, torch.Tensor):
            index = index.to(self.stored.device)
        rows = self.stored[index]
        if rows.dim() < self.stored.dim():  # one scan
            return ((rows[None].to(self.dtype) - self._mean) / self._std)[0]
        return (rows.to(self.dtype) - self._mean) / self._std

    def to(self, device: torch.device | str, non_blocking: bool = False) -> NormalizedView:
        """The view with its stored tensor on ``device`` (storage dtype kept)."""
        return NormalizedView(self.stored.to(device, non_blocking=non_blocking), self.normalization)

    def pin_memory(self) -> NormalizedView:
        return NormalizedView(self.stored.pin_memory(), self.normalization)

    def numpy(self) -> np.ndarray:
        return self[:].cpu().numpy()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def whole(value: object) -> object:
            return value[:] if isinstance(value, NormalizedView) else value

        return func(*tree_map(whole, args), **tree_map(whole, kwargs or {}))

    def __repr__(self) -> str:
        return (
            f"NormalizedView(shape={tuple(self.shape)}, stored={self.stored.dtype}, "
            f"device={self.device}, {self.normalization})"
        )
