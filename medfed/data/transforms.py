"""The deterministic preprocessing stage of each modality, as dictionary transforms.

Fundus photos go through MONAI's steps written out here (:class:`FundusPipeline`); CT volumes
through MONAI's own transforms, imported where their pipeline is built: MONAI takes seconds to
import, and cached scans (the common case) never need it. Which function a modality uses is
decided in :mod:`medfed.data.modality`; site normalization follows in :mod:`medfed.data.preprocess`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from medfed.config import CTPreprocess, FundusPreprocess
from medfed.core.errors import DataError
from medfed.data.disc import DiscPosition
from medfed.data.io import Volume

if TYPE_CHECKING:
    from monai.data import MetaTensor
    from monai.transforms import Compose


class CameraField:
    """Foreground selector for the camera field: pixels brighter than a share of the maximum."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def __call__(self, img: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        brightness = (
            img.mean(0, keepdims=True) if isinstance(img, np.ndarray) else img.mean(0, True)
        )
        return brightness > self.threshold * float(brightness.max())


class DiscCrop:
    """An optic-disc-centred square crop of a channel-first photo (a dictionary transform).

    The disc is the brightest structure of a fundus photo: its centre is taken as the maximum
    of the brightness averaged over a window a quarter of the crop wide (so that a glint or a
    single hot pixel does not win). The square is ``fraction`` of the photo's short side,
    moved inside the photo where the disc lies near an edge.
    """

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def __call__(self, data: dict) -> dict:
        image = data["image"]
        h, w = image.shape[-2:]
        side = max(1, round(self.fraction * min(h, w)))
        given = data.pop(DISC_KEY, None)
        if given is not None:  # the layout's position, cropped along with the photo
            marked = np.asarray(given)[0]
            if not marked.any():
                raise ValueError(
                    "the layout's optic disc position lies outside the photo's camera field"
                )
            y, x = np.unravel_index(int(np.argmax(marked)), (h, w))
        else:
            y, x = _brightest(image, side)
        top = int(np.clip(y - side // 2, 0, h - side))
        left = int(np.clip(x - side // 2, 0, w - side))
        data["image"] = image[:, top : top + side, left : left + side]
        return data


def _brightest(image, side: int) -> tuple[int, int]:
    """The (row, column) of the brightest window a quarter of the crop wide."""
    from scipy.ndimage import uniform_filter

    brightness = np.asarray(image, dtype=np.float32).mean(axis=0)
    smooth = uniform_filter(brightness, size=max(3, side // 4), mode="nearest")
    y, x = np.unravel_index(int(np.argmax(smooth)), smooth.shape)
    return int(y), int(x)


# The key of a one-channel map marking the layout's disc centre with a single 1: cropped to the
# camera field with the photo, so the point follows the photo's pixels.
DISC_KEY = "disc"


def disc_map(height: int, width: int, x: float, y: float) -> np.ndarray:
    """A (1, height, width) map, 1 at the pixel holding (x, y), 0 elsewhere."""
    marked = np.zeros((1, height, width), dtype=np.float32)
    marked[0, min(int(y), height - 1), min(int(x), width - 1)] = 1.0
    return marked


class FundusPipeline:
    """uint8 RGB (H, W, 3) -> float32 (3, S, S) in [0, 1]: cropped to the camera field (and,
    with ``disc_crop``, to a square around the optic disc), its longest side resized to S by
    area averaging, padded to a square with zeros around it, scaled from 0..255 to 0..1.

    The steps are MONAI's (``CropForegroundd`` with :class:`CameraField`, ``Resized`` with
    ``size_mode="longest", mode="area"``, ``SpatialPadd``, ``ScaleIntensityRanged``) written
    out, value for value (tests/test_pipeline.py holds them equal): importing MONAI takes
    seconds, which every process that decodes a photo paid before its first scan. CT keeps
    MONAI's pipeline (resampling to a spacing)."""

    def __init__(self, options: FundusPreprocess, with_disc: bool = False) -> None:
        self.options, self.with_disc = options, with_disc

    def __call__(self, data: dict) -> dict:
        options = self.options
        # channel-first view of the photo, strides as MONAI's EnsureChannelFirstd leaves them
        image = torch.from_numpy(data["image"]).movedim(-1, 0)
        disc = data.get(DISC_KEY)
        if options.roi_crop:
            rows, cols = _field_box(CameraField(options.roi_threshold)(image).any(0))
            image = image[:, rows, cols]
            if self.with_disc and disc is not None:
                disc = np.asarray(disc)[:, rows, cols]
        if options.disc_crop:
            cropped = DiscCrop(options.disc_crop)({"image": image, DISC_KEY: disc})
            image = cropped["image"]
        data["image"] = _scaled(_padded(_resized(image, options.image_size), options.image_size))
        data.pop(DISC_KEY, None)
        return data


def _field_box(mask: torch.Tensor) -> tuple[slice, slice]:
    """The rows and columns of the smallest box holding every True pixel of ``mask`` (H, W)
    (the whole photo when none is)."""
    rows, cols = torch.nonzero(mask.any(1)), torch.nonzero(mask.any(0))
    if not len(rows):
        return slice(0, 0), slice(0, 0)
    return slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1)


def _resized(image: torch.Tensor, size: int) -> torch.Tensor:
    """The longest side to ``size`` by area averaging, the aspect ratio kept."""
    h, w = image.shape[1:]
    scale = size / max(h, w)
    target = (int(round(h * scale)), int(round(w * scale)))
    if target == (h, w):
        return image.float()
    out = torch.nn.functional.interpolate(image.float().unsqueeze(0), size=target, mode="area")
    return out.squeeze(0)


def _padded(image: torch.Tensor, size: int) -> torch.Tensor:
    """Zeros around the image, half on each side (the odd one after), to size x size."""
    h, w = image.shape[1:]
    dh, dw = max(size - h, 0), max(size - w, 0)
    if not (dh or dw):
        return image
    return torch.nn.functional.pad(image, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2))


def _scaled(image: torch.Tensor) -> torch.Tensor:
    """0..255 to 0..1, in float32."""
    return ((image - 0.0) / (255.0 - 0.0) * (1.0 - 0.0) + 0.0).to(torch.float32)


def fundus_pipeline(options: FundusPreprocess, *, with_disc: bool = False) -> FundusPipeline:
    """The fundus preprocessing of ``options`` (see :class:`FundusPipeline`)."""
    return FundusPipeline(options, with_disc)


def ct_pipeline(options: CTPreprocess) -> Compose:
    """HU volume (D, H, W) with spacing -> float32 (1, *shape) in [0, 1] after the HU window."""
    from monai.transforms import (
        Compose,
        EnsureTyped,
        ResizeWithPadOrCropd,
        ScaleIntensityRanged,
        Spacingd,
    )

    lo, hi = options.hu_window
    return Compose(
        [
            ScaleIntensityRanged(keys="image", a_min=lo, a_max=hi, b_min=0.0, b_max=1.0, clip=True),
            Spacingd(keys="image", pixdim=options.spacing, mode="bilinear", padding_mode="border"),
            ResizeWithPadOrCropd(keys="image", spatial_size=options.shape),
            EnsureTyped(keys="image", data_type="tensor", dtype=torch.float32, track_meta=False),
        ]
    )


def volume_to_meta(volume: Volume) -> MetaTensor:
    """A (1, D, H, W) MetaTensor whose affine carries the volume's spacing, for Spacingd."""
    from monai.data import MetaTensor

    affine = torch.diag(torch.tensor([*volume.spacing, 1.0], dtype=torch.float64))
    return MetaTensor(torch.from_numpy(np.ascontiguousarray(volume.array))[None], affine=affine)


# A photo whose brightest pixel is below this (of 255) is black: compression noise, no field.
NEARLY_BLACK = 8


class NoCameraField(DataError):
    """A photo with nothing in it: one colour everywhere (all black, say), so no camera field."""


def fundus_tensor(
    options: FundusPreprocess, image: np.ndarray, disc: DiscPosition | None = None
) -> torch.Tensor:
    """Run the fundus pipeline on one decoded photo; NoCameraField for a one-colour image.
    ``disc``: where the layout says the optic disc lies (the disc crop centres there)."""
    if image.size == 0 or int(image.max()) < NEARLY_BLACK:
        raise NoCameraField("the image is all black")
    if np.all(image == image[:1, :1]):
        colour = tuple(int(v) for v in np.asarray(image[0, 0]).reshape(-1))
        raise NoCameraField(f"the image is a single colour (every pixel {colour})")
    # float32 copy: the decoder's array may be read-only, and the ROI mask needs floats.
    data = {"image": np.asarray(image, dtype=np.float32).copy()}
    use_disc = disc is not None and bool(options.disc_crop)
    if use_disc:
        h, w = image.shape[:2]
        data[DISC_KEY] = disc_map(h, w, *disc.locate(h, w))
    out = fundus_pipeline(options, with_disc=use_disc)(data)
    return out["image"].contiguous()


def ct_tensor(options: CTPreprocess, volume: Volume) -> torch.Tensor:
    """Run the CT pipeline on one decoded volume."""
    out = ct_pipeline(options)({"image": volume_to_meta(volume)})
    return out["image"].contiguous()
