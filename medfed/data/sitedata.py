"""Load a site: scan its layout, split by patient, preprocess through the cache, normalize."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from medfed.config import SiteManifest, count_from_env
from medfed.core.errors import DataError, MedfedError
from medfed.core.progress import bar
from medfed.data.cache import (
    StackWriter,
    TensorCache,
    cache_key,
    content_hash,
    scan_key,
    stack_key,
)
from medfed.data.disc import disc_of
from medfed.data.layouts import scan_site
from medfed.data.modality import read_record
from medfed.data.preprocess import (
    Normalization,
    NormalizedView,
    apply_pipeline,
    disc_key_part,
    pipeline_fingerprint,
    storage_dtype,
)
from medfed.data.records import Problem, Record, Split
from medfed.data.splits import assign_splits
from medfed.data.transforms import NoCameraField

_SHOWN = 5


@dataclass
class SiteData:
    """A site's preprocessed tensors per split, ready for training and evaluation.

    ``raw`` holds each split once, as the deterministic stage left it (before site
    normalization), in the cache's storage dtype and memory-mapped from the cache when it came
    from one. ``x`` is the same scans as the model reads them: a :class:`NormalizedView` per
    split that normalizes batch by batch, never a second copy. Routing compares a scan under
    each candidate site's own normalization (:meth:`as_seen_by`).
    """

    manifest: SiteManifest
    raw: dict[Split, torch.Tensor]
    y: dict[Split, torch.Tensor]
    records: dict[Split, list[Record]]
    normalization: Normalization
    cache_hits: int = 0
    cache_misses: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def x(self) -> Mapping[Split, NormalizedView]:
        """Each split under the site's normalization, normalized as it is read."""
        return {s: self.normalization.view(t) for s, t in self.raw.items()}

    def as_seen_by(self, other: SiteData, split: Split) -> NormalizedView:
        """This site's scans of ``split`` under ``other`` site's normalization."""
        return other.normalization.view(self.raw[split])

    def renormalized(self, norm: Normalization) -> SiteData:
        """This site with ``norm`` in place of its own statistics (a federation-wide one)."""
        return replace(self, normalization=norm)

    def n(self, split: Split) -> int:
        return int(self.y[split].shape[0])

    def class_counts(self, split: Split) -> dict[int, int]:
        labels, counts = torch.unique(self.y[split], return_counts=True)
        return {int(k): int(v) for k, v in zip(labels, counts, strict=True)}

    def nbytes(self) -> int:
        """Bytes of the site's scan tensors (each split once, as stored)."""
        return sum(t.numel() * t.element_size() for t in self.raw.values())


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
    """Decode and run the deterministic pipeline on one record, through the cache; the tensor
    comes back in the modality's storage dtype.

    ``decoded`` skips the decode when the caller already holds the decoded scan.
    """
    key = cache_key(record.content_files, pipeline_fingerprint(site) + _disc_part(site, record))
    return _preprocess(site, record, key, cache, decoded)


def _disc_part(site: SiteManifest, record: Record) -> str:
    """The cache key's share of the layout's disc position (a disc crop's centre)."""
    part = disc_key_part(site.preprocess, disc_of(record))
    return f":disc:{part}" if part else ""


def _preprocess(
    site: SiteManifest, record: Record, key: str, cache: TensorCache, decoded: object | None
) -> torch.Tensor:
    tensor = cache.get(key) if decoded is None else None
    if tensor is None:
        if decoded is None:
            decoded = read_record(record, site.modality)
        try:
            tensor = apply_pipeline(site.modality, site.preprocess, decoded, disc_of(record))
        except NoCameraField as exc:
            raise DataError(
                f"no camera field found in {record.path}: {exc}, not a fundus photograph"
            ) from exc
        except (RuntimeError, ValueError) as exc:  # MONAI wraps a failing transform's error
            raise DataError(
                f"{record.path}: preprocessing failed ({exc.__cause__ or exc}); "
                "check the image, or the site's [preprocess] settings"
            ) from exc
        tensor = tensor.to(storage_dtype(site.modality)).contiguous()
        cache.put(key, tensor)
    return tensor


def load_site(site: SiteManifest, cache: TensorCache, *, progress: bool = False) -> SiteData:
    """Everything a site contributes to training; refuses data with problems, naming them.

    Each split is held once: memory-mapped from its stacked cache file when one matches its
    scans, otherwise built from the per-scan cache (decoding what is missing) and written.
    """
    scan = scan_site(site)
    if scan.problems:
        raise _refuse(site, "problem(s) in the site's files", [str(p) for p in scan.problems])
    if not scan.records:
        raise DataError(f"site {site.id!r}: no scans found under {site.root}")
    hits, misses = cache.stats.hits, cache.stats.misses

    fingerprint = pipeline_fingerprint(site)
    contents: list[str] = []
    failures: list[Problem] = []
    for record in scan.records:
        try:
            contents.append(content_hash(record.content_files))
        except MedfedError as exc:
            failures.append(Problem(str(record.path), str(exc)))
    if failures:
        raise _refuse(site, "unreadable scan(s)", [str(p) for p in failures])
    keys = [
        scan_key(content, fingerprint + _disc_part(site, record))
        for content, record in zip(contents, scan.records, strict=True)
    ]
    # byte-identical scans (one image saved under two names) stay in one split, like a patient
    splits = assign_splits(scan.records, site.split, contents=contents)
    by_split: dict[Split, list[int]] = {s: [] for s in Split}
    for index, split in enumerate(splits):
        by_split[split].append(index)

    stored: dict[Split, torch.Tensor | None] = {}
    for split, idx in by_split.items():
        records = [scan.records[i] for i in idx]
        stored[split] = _split_tensor(
            site, cache, records, [keys[i] for i in idx], failures, progress
        )
    if failures:
        raise _refuse(site, "unreadable scan(s)", [str(p) for p in failures])
    for split in (Split.TRAIN, Split.TEST):
        if not by_split[split]:
            raise DataError(
                f"site {site.id!r}: the {split} split is empty; adjust [split] in "
                f"{site.manifest_path or 'the manifest'} (fractions, or add scans)"
            )
    like = next(t for t in stored.values() if t is not None)
    raw = {
        s: t if t is not None else like.new_empty((0, *like.shape[1:])) for s, t in stored.items()
    }
    y = {
        s: torch.tensor([scan.records[i].label for i in idx], dtype=torch.long)
        for s, idx in by_split.items()
    }
    norm = (
        Normalization.fit(raw[Split.TRAIN])
        if site.preprocess.normalize
        else Normalization.identity(like.shape[1])
    )
    return SiteData(
        manifest=site,
        raw=raw,
        y=y,
        records={s: [scan.records[i] for i in idx] for s, idx in by_split.items()},
        normalization=norm,
        cache_hits=cache.stats.hits - hits,
        cache_misses=cache.stats.misses - misses,
    )


def _split_tensor(
    site: SiteManifest,
    cache: TensorCache,
    records: list[Record],
    keys: list[str],
    failures: list[Problem],
    progress: bool,
) -> torch.Tensor | None:
    """One split's scans stacked in storage dtype: the cache's mapped file when it has a sound
    one, else built scan by scan into one buffer and written (None for an empty split, or when
    a scan failed: ``failures`` names it)."""
    if not records:
        return None
    dtype = storage_dtype(site.modality)
    key = stack_key(keys)
    mapped = cache.get_stack(key, len(records), dtype)
    if mapped is not None:
        return mapped
    writer: StackWriter | None = None
    failed = len(failures)
    scans = _preprocessed(site, cache, records, keys, decode_workers())
    shown = bar(scans, f"preprocess {site.id}", show=progress, total=len(records), unit="scan")
    try:
        for row, (record, tensor) in enumerate(shown):
            if isinstance(tensor, MedfedError):
                failures.append(Problem(str(record.path), str(tensor)))
                continue
            if writer is None:  # the split's rows go straight into its cache file's pages
                writer = cache.stack_writer(key, len(records), tensor.shape, dtype)
            if tensor.shape != writer.shape[1:]:
                raise DataError(
                    f"{record.path}: preprocessed to shape {tuple(tensor.shape)}, unlike the "
                    f"site's other scans {tuple(writer.shape[1:])}; check its [preprocess] "
                    "settings"
                )
            writer.rows[row] = tensor
        if writer is None or len(failures) > failed:
            return None
        return writer.finish()
    finally:
        if writer is not None:
            writer.discard()


def decode_workers() -> int:
    """Scans decoded at once when the cache is cold: one per core, at most 4
    (``MEDFED_DECODE_WORKERS`` sets it; 1 decodes in the calling thread)."""
    given = count_from_env("MEDFED_DECODE_WORKERS", "threads")
    if given is not None:
        return given
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def _preprocessed(
    site: SiteManifest,
    cache: TensorCache,
    records: list[Record],
    keys: list[str],
    workers: int,
) -> Iterator[tuple[Record, torch.Tensor | MedfedError]]:
    """Each record with its preprocessed tensor (or the error that refused it), in order.

    With ``workers`` > 1, up to that many scans are decoded and preprocessed at once on a pool
    of threads, off the thread that stacks them (image decoders and the resize release the
    GIL); the results are the same as one by one, in the same order.
    """

    def one(record: Record, key: str) -> torch.Tensor | MedfedError:
        try:
            return _preprocess(site, record, key, cache, None)
        except MedfedError as exc:
            return exc

    if workers <= 1 or len(records) < 2:
        for record, key in zip(records, keys, strict=True):
            yield record, one(record, key)
        return
    pending: deque[tuple[Record, Future]] = deque()
    items = iter(zip(records, keys, strict=True))
    with ThreadPoolExecutor(workers, "medfed-decode") as pool:
        for record, key in items:
            pending.append((record, pool.submit(one, record, key)))
            if len(pending) >= 2 * workers:  # a bounded window: few decoded scans wait
                break
        while pending:
            record, future = pending.popleft()
            following = next(items, None)
            if following is not None:
                pending.append((following[0], pool.submit(one, *following)))
            yield record, future.result()


def no_validation_warning(site: SiteData, operating_point: str) -> str | None:
    """Words for a two-class site without validation scans whose operating point must be
    chosen on them (any rule but ``threshold:T``): training falls back to threshold 0.5 there
    and reports no validation AUC. None when nothing falls back."""
    from medfed.core.operating_rule import OperatingRule

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
