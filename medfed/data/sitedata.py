"""Load a site: scan its layout, split by patient, preprocess through the cache, normalize."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from medfed.config import SiteManifest
from medfed.data.cache import TensorCache, cache_key, content_hash
from medfed.data.layouts import scan_site
from medfed.data.modality import read_record
from medfed.data.preprocess import Normalization, apply_pipeline, pipeline_fingerprint
from medfed.data.records import Problem, Record, Split
from medfed.data.splits import assign_splits
from medfed.data.transforms import NoCameraField
from medfed.errors import DataError, MedfedError
from medfed.progress import bar

_SHOWN = 5


@dataclass
class SiteData:
    """A site's preprocessed tensors per split, ready for training and evaluation.

    ``raw`` is the output of the deterministic stage (before site normalization) and ``x`` the
    normalized tensors the site trains on; routing compares a scan under each candidate site's
    own normalization, so it needs ``raw``.
    """

    manifest: SiteManifest
    raw: dict[Split, torch.Tensor]
    x: dict[Split, torch.Tensor]
    y: dict[Split, torch.Tensor]
    records: dict[Split, list[Record]]
    normalization: Normalization
    cache_hits: int = 0
    cache_misses: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.manifest.id

    def as_seen_by(self, other: SiteData, split: Split) -> torch.Tensor:
        """This site's scans of ``split`` under ``other`` site's normalization."""
        return other.normalization.apply(self.raw[split])

    def renormalized(self, norm: Normalization) -> SiteData:
        """This site with ``norm`` in place of its own statistics (a federation-wide one)."""
        return replace(self, x={s: norm.apply(t) for s, t in self.raw.items()}, normalization=norm)

    def n(self, split: Split) -> int:
        return int(self.y[split].shape[0])

    def class_counts(self, split: Split) -> dict[int, int]:
        labels, counts = torch.unique(self.y[split], return_counts=True)
        return {int(k): int(v) for k, v in zip(labels, counts, strict=True)}


def _refuse(site: SiteManifest, what: str, items: list[str]) -> DataError:
    listed = "\n  ".join(items[:_SHOWN])
    more = f"\n  ... and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    where = site.manifest_path or site.id
    return DataError(
        f"site {site.id!r} ({where}): {len(items)} {what}:\n  {listed}{more}\n"
        f"Run 'medfed sites check {where}' for the full list and what to do."
    )


def preprocess_record(
    site: SiteManifest, record: Record, cache: TensorCache, decoded: object | None = None
) -> torch.Tensor:
    """Decode and run the deterministic pipeline on one record, through the cache.

    ``decoded`` skips the decode when the caller already holds the decoded scan.
    """
    key = cache_key(record.content_files, pipeline_fingerprint(site))
    tensor = cache.get(key) if decoded is None else None
    if tensor is None:
        if decoded is None:
            decoded = read_record(record, site.modality)
        try:
            tensor = apply_pipeline(site.modality, site.preprocess, decoded)
        except NoCameraField as exc:
            raise DataError(
                f"no camera field found in {record.path}: {exc}, not a fundus photograph"
            ) from exc
        except (RuntimeError, ValueError) as exc:  # MONAI wraps a failing transform's error
            raise DataError(
                f"{record.path}: preprocessing failed ({exc.__cause__ or exc}); "
                "check the image, or the site's [preprocess] settings"
            ) from exc
        cache.put(key, tensor)
    return tensor


def load_site(site: SiteManifest, cache: TensorCache, *, progress: bool = False) -> SiteData:
    """Everything a site contributes to training; refuses data with problems, naming them."""
    scan = scan_site(site)
    if scan.problems:
        raise _refuse(site, "problem(s) in the site's files", [str(p) for p in scan.problems])
    if not scan.records:
        raise DataError(f"site {site.id!r}: no scans found under {site.root}")
    hits, misses = cache.stats.hits, cache.stats.misses

    tensors: list[torch.Tensor] = []
    failures: list[Problem] = []
    for record in bar(scan.records, f"preprocess {site.id}", show=progress, unit="scan"):
        try:
            tensors.append(preprocess_record(site, record, cache))
        except MedfedError as exc:
            failures.append(Problem(str(record.path), str(exc)))
    if failures:
        raise _refuse(site, "unreadable scan(s)", [str(p) for p in failures])
    # byte-identical scans (one image saved under two names) stay in one split, like a patient
    contents = [content_hash(r.content_files) for r in scan.records]
    splits = assign_splits(scan.records, site.split, contents=contents)

    by_split: dict[Split, list[int]] = {s: [] for s in Split}
    for index, split in enumerate(splits):
        by_split[split].append(index)
    for split in (Split.TRAIN, Split.TEST):
        if not by_split[split]:
            raise DataError(
                f"site {site.id!r}: the {split} split is empty; adjust [split] in "
                f"{site.manifest_path or 'the manifest'} (fractions, or add scans)"
            )
    x_raw = {s: _stack([tensors[i] for i in idx], tensors[0]) for s, idx in by_split.items()}
    y = {
        s: torch.tensor([scan.records[i].label for i in idx], dtype=torch.long)
        for s, idx in by_split.items()
    }
    channels = tensors[0].shape[0]
    norm = (
        Normalization.fit(x_raw[Split.TRAIN])
        if site.preprocess.normalize
        else Normalization.identity(channels)
    )
    return SiteData(
        manifest=site,
        raw=x_raw,
        x={s: norm.apply(t) for s, t in x_raw.items()},
        y=y,
        records={s: [scan.records[i] for i in idx] for s, idx in by_split.items()},
        normalization=norm,
        cache_hits=cache.stats.hits - hits,
        cache_misses=cache.stats.misses - misses,
    )


def _stack(items: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if not items:
        return torch.empty((0, *like.shape), dtype=like.dtype)
    return torch.stack(items)


def no_validation_warning(site: SiteData, operating_point: str) -> str | None:
    """Words for a two-class site without validation scans whose operating point must be
    chosen on them (any rule but ``threshold:T``): training falls back to threshold 0.5 there
    and reports no validation AUC. None when nothing falls back."""
    from medfed.metrics import OperatingRule

    if len(site.manifest.class_names()) != 2 or site.n(Split.VAL) > 0:
        return None
    try:
        rule = OperatingRule.parse(operating_point)
    except ValueError:
        return None  # the configuration check names a bad rule
    if rule.kind == "threshold":
        return None
    where = site.manifest.manifest_path or "its manifest"
    return (
        f"site {site.id} has no validation split: its operating threshold falls back to 0.5 "
        f"instead of the rule {rule}, and no validation AUC is reported; set [split] "
        f"val_fraction (e.g. 0.15) in {where} to tune it"
    )
