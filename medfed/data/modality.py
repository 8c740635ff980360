"""The modality registry: what differs between fundus photos and CT volumes, in one place.

Every stage (decoding, preprocessing, onboarding checks, training augmentation, the default
backbone, the dashboard's pictures) looks its modality up here instead of branching on it, so a
new modality is one new entry. Plain data: names, numbers and functions; nothing here imports
models, algorithms, federation, serving or runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from medfed.config import LAYOUTS_BY_MODALITY, PREPROCESS_BY_MODALITY, Modality
from medfed.core.errors import ManifestError
from medfed.data.io import Decoded, read_photo, read_volume
from medfed.data.records import Record
from medfed.data.transforms import ct_tensor, fundus_tensor

if TYPE_CHECKING:
    import torch

    from medfed.config import CTPreprocess, FundusPreprocess


@dataclass(frozen=True)
class ModalitySpec:
    """One imaging modality, as every stage of medfed needs to know it."""

    modality: Modality
    scan: str  # what one record (one "scan") is, in words
    spatial_dims: int  # 2: a scan is (channels, H, W); 3: (channels, D, H, W)
    layouts: tuple[str, ...]  # on-disk layouts a site of this modality may use
    options: type[FundusPreprocess] | type[CTPreprocess]  # its manifest's [preprocess] table
    decode: Callable[[Record], Decoded]  # a record -> the decoded scan (io)
    preprocess: Callable[..., torch.Tensor]  # (options, decoded scan) -> cacheable tensor
    intensity_unit: str  # of a decoded scan, before preprocessing
    # Training-time augmentation: a random left-right flip keeps a fundus photo plausible (a
    # right eye mirrors a left one); body anatomy is not left-right symmetric, so CT is not.
    horizontal_flip: bool
    # Default backbones: GroupNorm, unless the algorithm keeps normalization layers on each
    # site (FedBN, FedDRM with private norms), where BatchNorm's statistics stay per site.
    backbone: str
    batch_norm_backbone: str
    # The learning rate `medfed train` uses when none is given (Adam, cosine decay). CT lesions
    # are a few hot spots in a mostly empty volume: at fundus' 2e-3 the 2.5-D and 3-D networks
    # stayed at chance on the synthetic CT federation, at 3e-4 they learned it.
    lr: float
    # Under differential privacy: a backbone whose every layer sees one scan at a time (no
    # BatchNorm, no slices batched together), so that each scan has a gradient of its own.
    dp_backbone: str

    def default_backbone(self, batch_norm: bool, private: bool = False) -> str:
        """The backbone to train when none is chosen; ``batch_norm``: norms stay private;
        ``private``: differentially private training."""
        if private:
            return self.dp_backbone
        return self.batch_norm_backbone if batch_norm else self.backbone


FUNDUS = ModalitySpec(
    modality=Modality.FUNDUS,
    scan="one fundus photograph (an image file); a patient may have several",
    spatial_dims=2,
    layouts=LAYOUTS_BY_MODALITY[Modality.FUNDUS],
    options=PREPROCESS_BY_MODALITY[Modality.FUNDUS],
    decode=read_photo,
    preprocess=fundus_tensor,
    intensity_unit="0-255",
    horizontal_flip=True,
    backbone="cnn-gn",
    batch_norm_backbone="cnn",
    lr=0.002,
    dp_backbone="cnn-gn",
)

CT = ModalitySpec(
    modality=Modality.CT,
    scan="one patient's CT volume (a DICOM series folder or a NIfTI file)",
    spatial_dims=3,
    layouts=LAYOUTS_BY_MODALITY[Modality.CT],
    options=PREPROCESS_BY_MODALITY[Modality.CT],
    decode=read_volume,
    preprocess=ct_tensor,
    intensity_unit="HU",
    horizontal_flip=False,
    # 2.5-D: on a CPU it trains several times more volumes per second than the MONAI 3-D ResNet
    # and learned the lesion task better per step (docs/ct.md); monai3d(-gn) stays selectable.
    backbone="slices-cnn-gn",
    batch_norm_backbone="slices-cnn",
    lr=3e-4,
    dp_backbone="monai3d-gn",
)

MODALITIES: Mapping[Modality, ModalitySpec] = MappingProxyType(
    {FUNDUS.modality: FUNDUS, CT.modality: CT}
)


def modality_spec(modality: Modality | str) -> ModalitySpec:
    """The registry entry of ``modality`` (a :class:`Modality` or its name, e.g. 'ct')."""
    try:
        return MODALITIES[Modality(modality)]
    except (ValueError, KeyError):
        raise ManifestError(
            f"modality {modality!r} is not one of {[str(m) for m in MODALITIES]}; "
            "fix 'modality' in the site manifest"
        ) from None


def read_record(record: Record, modality: Modality | str) -> Decoded:
    """Decode one record with its modality's decoder: RGB for a photo, HU for a volume."""
    return modality_spec(modality).decode(record)
