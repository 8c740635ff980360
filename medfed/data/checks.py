"""Onboarding validation: is a site ready to join the federation? -> SiteReport.

Every file is decoded once (and the result cached for training). Nothing bad is skipped without
being listed: each problem names its file and what to do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medfed.config import SiteManifest, load_manifest
from medfed.core.errors import ManifestError, MedfedError
from medfed.core.names import printable
from medfed.core.progress import bar
from medfed.core.reliability import RELIABLE_MIN, unreliable
from medfed.data.cache import TensorCache, content_hash
from medfed.data.disc import disc_of
from medfed.data.distances import SiteFeatures, scan_features, site_distances
from medfed.data.io import ImageInfo, Volume, image_info
from medfed.data.layouts import scan_site
from medfed.data.modality import modality_spec, read_record
from medfed.data.photochecks import (
    border_share,
    border_warnings,
    federation_photo_warnings,
    format_warnings,
)
from medfed.data.plausibility import modality_doubts
from medfed.data.records import Problem, Record, Split
from medfed.data.scanstats import acquisition_values, histogram_edges, scan_histogram
from medfed.data.sitedata import preprocess_record
from medfed.data.splits import assign_splits

EXIT_READY, EXIT_PROBLEMS, EXIT_UNUSABLE = 0, 1, 2


@dataclass
class SiteReport:
    """What ``medfed sites check`` found for one manifest."""

    manifest: str
    site: str = ""
    modality: str = ""
    layout: str = ""
    root: str = ""
    unusable: str = ""  # set when the manifest itself cannot be used (exit 2)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    n_records: int = 0
    n_readable: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> class -> n
    sizes: dict[str, Any] = field(default_factory=dict)
    intensity: dict[str, Any] = field(default_factory=dict)
    # CT: how the readable volumes were oriented ("RAS (from LPS DICOM)") -> number of scans
    orientation: dict[str, int] = field(default_factory=dict)
    distances: dict[str, float] = field(default_factory=dict)
    # "HxW" (or "DxHxW") -> readable scans of that size before preprocessing
    size_counts: dict[str, int] = field(default_factory=dict)
    # unit, fixed bin edges, and per channel the scans' worth of pixels per bin (scanstats)
    histogram: dict[str, Any] = field(default_factory=dict)
    # acquisition field (manufacturer, camera, ...) -> value -> number of scans
    acquisition: dict[str, dict[str, int]] = field(default_factory=dict)
    features: np.ndarray | None = field(default=None, repr=False)
    # content hash -> the readable scan's file (cross-site copies are found from it)
    contents: dict[str, Path] = field(default_factory=dict, repr=False)
    # file format ("JPEG", "PNG") -> readable photos of it
    formats: dict[str, int] = field(default_factory=dict)
    # Fundus with a disc crop or a layout that gives disc positions: how many readable photos
    # have their optic disc's position from the layout, how many have it estimated.
    disc: dict[str, int] = field(default_factory=dict)

    def disc_text(self) -> str:
        """``12 from the layout, 3 estimated from the photo``, or "" where nothing tells."""
        if not self.disc:
            return ""
        return (
            f"{self.disc['layout']} from the layout, {self.disc['estimated']} estimated from "
            "the photo"
        )

    @property
    def exit_code(self) -> int:
        if self.unusable:
            return EXIT_UNUSABLE
        return EXIT_PROBLEMS if self.problems else EXIT_READY

    @property
    def ready(self) -> bool:
        return self.exit_code == EXIT_READY

    def sizes_text(self) -> str:
        """The scans' sizes for a reader: ``300x300 to 512x512 pixels (most often 300x300, 2
        distinct sizes)``; with CT, the voxel spacing too. ``n/a`` when no scan was read."""
        return sizes_text(self.sizes)

    def intensity_text(self) -> str:
        """The scans' mean intensity and spread before preprocessing, per channel, with its
        unit: ``mean 120.5, 80.2, 40.1 (std 30.2, 20.1, 10.3), 0-255``."""
        return intensity_text(self.intensity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "site": self.site,
            "modality": self.modality,
            "layout": self.layout,
            "root": self.root,
            "ready": self.ready,
            "exit_code": self.exit_code,
            "unusable": self.unusable or None,
            "problems": [
                {"file": p.file, "message": p.message, "hint": p.hint} for p in self.problems
            ],
            "warnings": self.warnings,
            "n_records": self.n_records,
            "n_readable": self.n_readable,
            "n_unreadable": self.n_records - self.n_readable,
            "counts": self.counts,
            "sizes": self.sizes,
            "intensity": self.intensity,
            "orientation": self.orientation,
            "distances": self.distances,
            "disc": self.disc,
            "size_counts": self.size_counts,
            "histogram": self.histogram,
            "acquisition": self.acquisition,
            "formats": self.formats,
        }


def _dims(values: Any, digits: int | None = None) -> str:
    numbers = [round(float(v), digits) if digits is not None else v for v in values]
    return "x".join(f"{v:g}" if isinstance(v, float) else str(v) for v in numbers)


def sizes_text(sizes: dict[str, Any]) -> str:
    """See :meth:`SiteReport.sizes_text` (also for a report read back from JSON)."""
    if not sizes:
        return "n/a"
    if "min" not in sizes:  # a run's overview records only the size after preprocessing
        return "; ".join(
            f"{k}: {_dims(v) if isinstance(v, list | tuple) else v}" for k, v in sizes.items()
        )
    low, high = _dims(sizes["min"]), _dims(sizes["max"])
    span = low if low == high else f"{low} to {high}"
    distinct = int(sizes.get("distinct", 1))
    text = f"{span} pixels" if len(sizes["min"]) == 2 else f"{span} voxels"
    if distinct > 1:
        text += f" (most often {_dims(sizes['most_common'])}, {distinct} distinct sizes)"
    if sizes.get("spacing_mm_min"):
        low, high = _dims(sizes["spacing_mm_min"], 3), _dims(sizes["spacing_mm_max"], 3)
        text += f"; spacing {low if low == high else f'{low} to {high}'} mm"
    return text


def intensity_text(intensity: dict[str, Any]) -> str:
    """See :meth:`SiteReport.intensity_text`."""
    if not intensity:
        return "n/a"
    mean = ", ".join(f"{v:g}" for v in intensity.get("mean", []))
    std = ", ".join(f"{v:g}" for v in intensity.get("std", []))
    unit = intensity.get("unit")
    return f"mean {mean} (std {std})" + (f", {unit}" if unit else "")


def _raw_stats(decoded: np.ndarray | Volume) -> tuple[tuple[int, ...], np.ndarray, tuple]:
    """(shape, per-channel mean/std, spacing) of a decoded scan, before preprocessing."""
    if isinstance(decoded, Volume):
        a = decoded.array
        return a.shape, np.array([[a.mean(), a.std()]]), decoded.spacing
    a = decoded.reshape(-1, decoded.shape[-1]).astype(np.float64)
    return decoded.shape[:2], np.stack([a.mean(0), a.std(0)], axis=1), ()


def _pixels(decoded: np.ndarray | Volume) -> np.ndarray:
    """A decoded scan as (pixels, channels), before preprocessing."""
    if isinstance(decoded, Volume):
        return decoded.array.reshape(-1, 1)
    return decoded.reshape(-1, decoded.shape[-1])


def _summarize_sizes(shapes: list[tuple[int, ...]], spacings: list[tuple]) -> dict[str, Any]:
    if not shapes:
        return {}
    counts = Counter(shapes)
    out: dict[str, Any] = {
        "min": list(np.min(shapes, axis=0).tolist()),
        "max": list(np.max(shapes, axis=0).tolist()),
        "most_common": list(counts.most_common(1)[0][0]),
        "distinct": len(counts),
    }
    if spacings and spacings[0]:
        arr = np.array(spacings, dtype=np.float64)
        out["spacing_mm_min"] = arr.min(axis=0).round(3).tolist()
        out["spacing_mm_max"] = arr.max(axis=0).round(3).tolist()
    return out


def check_site(manifest: SiteManifest, cache: TensorCache) -> SiteReport:
    """Validate one loaded manifest: layout, every file, labels, counts, statistics.

    File names in the report are escaped (see :func:`medfed.core.names.printable`), so that a name
    with a newline or bytes that are not UTF-8 neither fakes a line nor fails when printed.
    """
    return _escaped(_check_site(manifest, cache))


def _escaped(report: SiteReport) -> SiteReport:
    """``report`` with every path and message made printable (valid UTF-8, one line each)."""
    report.manifest, report.root = printable(report.manifest), printable(report.root)
    report.unusable = printable(report.unusable)
    report.problems = [
        Problem(printable(p.file), printable(p.message), printable(p.hint)) for p in report.problems
    ]
    report.warnings = [printable(w) for w in report.warnings]
    return report


def _check_site(manifest: SiteManifest, cache: TensorCache) -> SiteReport:
    report = SiteReport(
        manifest=str(manifest.manifest_path or manifest.id),
        site=manifest.id,
        modality=str(manifest.modality),
        layout=manifest.layout,
        root=str(manifest.root),
    )
    try:
        scan = scan_site(manifest)
    except MedfedError as exc:
        report.unusable = str(exc)
        return report
    report.problems.extend(scan.problems)
    report.warnings.extend(_grouped_warnings(manifest, scan.warnings))
    report.n_records = len(scan.records)
    if not scan.records:
        report.problems.append(
            Problem(str(manifest.root), "no scans found", f"check the '{manifest.layout}' layout")
        )
        return report

    readings = _Readings(manifest)
    records = bar(scan.records, f"check {manifest.id}", unit="scan", total=len(scan.records))
    for record in records:
        try:
            readings.read(record, cache)
        except MedfedError as exc:
            report.problems.append(
                Problem(str(record.path), str(exc), "replace or remove the file, then re-check")
            )
    readings.fill(report)
    report.disc = _disc_counts(manifest, scan.records, readings.readable)
    readable, contents = readings.readable, readings.contents
    report.warnings.extend(_duplicate_warnings(manifest, readable, contents))
    report.contents = {c: r.path for r, c in zip(readable, contents, strict=True)}
    if readable:
        _count(manifest, readable, report, contents)
    else:
        _count(manifest, scan.records, report, None)
    return report


class _Readings:
    """What ``sites check`` gathers from each readable scan of a site, and the report's figures
    and warnings made of it."""

    def __init__(self, manifest: SiteManifest) -> None:
        self.manifest = manifest
        self.shapes: list[tuple[int, ...]] = []
        self.spacings: list[tuple] = []
        self.moments: list[np.ndarray] = []
        self.features: list[np.ndarray] = []
        self.readable: list[Record] = []
        self.contents: list[str] = []
        self.kinds: dict[tuple[str, str], list[Path]] = {}
        self.orientations: Counter[str] = Counter()
        self.unit = modality_spec(manifest.modality).intensity_unit
        self.edges, self.histogram = histogram_edges(self.unit), None
        self.acquisition: dict[str, Counter[str]] = {}
        self.unlike: dict[tuple[str, ...], list[Path]] = {}
        self.formats: dict[str, Counter[str]] = {}  # class name -> file format -> photos
        self.borders: list[float] = []

    def read(self, record: Record, cache: TensorCache) -> None:
        """Decode, preprocess (into the cache) and measure one scan; MedfedError when it
        cannot be read."""
        manifest = self.manifest
        decoded = read_record(record, manifest.modality)
        if (disc := disc_of(record)) is not None and isinstance(decoded, np.ndarray):
            disc.locate(*decoded.shape[:2])  # inside the photo, its mask usable
        tensor = preprocess_record(manifest, record, cache, decoded=decoded)
        content = content_hash(record.content_files)
        if isinstance(decoded, np.ndarray):
            info = _note_kind(manifest, record.path, self.kinds)
            name = str(record.meta.get("class_name") or manifest.class_names()[record.label])
            self.formats.setdefault(name, Counter())[info.format or "unknown"] += 1
            self.borders.append(border_share(decoded))
        if doubts := modality_doubts(manifest.modality, decoded):
            self.unlike.setdefault(tuple(doubts), []).append(record.path)
        shape, moment, spacing = _raw_stats(decoded)
        if isinstance(decoded, Volume) and decoded.orientation is not None:
            self.orientations[decoded.orientation.describe()] += 1
        self.shapes.append(tuple(int(s) for s in shape))
        one = scan_histogram(_pixels(decoded), self.edges)
        self.histogram = one if self.histogram is None else self.histogram + one
        for key, value in acquisition_values(record.meta).items():
            self.acquisition.setdefault(key, Counter())[value] += 1
        self.spacings.append(spacing)
        self.moments.append(moment)
        self.features.append(scan_features(tensor))
        self.readable.append(record)
        self.contents.append(content)

    def fill(self, report: SiteReport) -> None:
        """The report's sizes, histogram, intensity, formats and the warnings of what was read."""
        manifest = self.manifest
        report.n_readable = len(self.readable)
        report.sizes = _summarize_sizes(self.shapes, self.spacings)
        report.size_counts = {_dims(k): n for k, n in Counter(self.shapes).most_common()}
        if self.histogram is not None:
            report.histogram = {
                "unit": self.unit,
                "edges": [float(e) for e in self.edges],
                "counts": [[round(float(v), 4) for v in row] for row in self.histogram],
            }
        report.acquisition = {k: dict(v.most_common()) for k, v in self.acquisition.items()}
        report.orientation = dict(self.orientations.most_common())
        unknown = sum(n for how, n in self.orientations.items() if how.startswith("unknown"))
        if unknown:
            report.warnings.append(
                f"{unknown} volume(s) have no orientation in their headers, so their left and "
                "right may not match the other volumes' (see the card's orientation); export "
                "them with ImageOrientationPatient (DICOM) or a qform/sform (NIfTI)"
            )
        if self.moments:
            m = np.stack(self.moments)  # (n, channels, 2)
            report.intensity = {
                "unit": self.unit,
                "mean": [round(float(v), 2) for v in m[:, :, 0].mean(axis=0)],
                "std": [round(float(v), 2) for v in m[:, :, 1].mean(axis=0)],
            }
            report.features = np.stack(self.features)
        total: Counter[str] = Counter()
        for per in self.formats.values():
            total.update(per)
        report.formats = dict(total.most_common())
        for (what, how), paths in self.kinds.items():
            report.warnings.append(
                f"{len(paths)} {what} image(s) ({how}): {_names(manifest, paths)}"
            )
        report.warnings.extend(format_warnings(manifest, self.formats))
        report.warnings.extend(border_warnings(manifest, self.borders))
        report.warnings.extend(_unlike_warnings(manifest, self.unlike))


def _disc_counts(
    manifest: SiteManifest, records: list[Record], readable: list[Record]
) -> dict[str, int]:
    """Readable photos whose disc position the layout gives, and those the crop estimates;
    empty where neither a disc crop nor a layout position is in play."""
    given = sum(1 for r in readable if disc_of(r) is not None)
    crop = bool(getattr(manifest.preprocess, "disc_crop", 0.0))
    if not crop and not any(disc_of(r) is not None for r in records):
        return {}
    return {"layout": given, "estimated": len(readable) - given}


_SHOWN = 5  # file names listed per warning


def _names(manifest: SiteManifest, paths: list[Path]) -> str:
    """The first few file names (relative to the site root), and how many more there are."""
    shown = []
    for path in paths[:_SHOWN]:
        try:
            shown.append(str(Path(path).relative_to(manifest.root)))
        except ValueError:
            shown.append(str(path))
    more = f", ... and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else ""
    return ", ".join(shown) + more


def _grouped_warnings(manifest: SiteManifest, warnings: list[Problem]) -> list[str]:
    """One line per kind of layout warning (stray files), with the count and the names."""
    by_message: dict[str, list[Problem]] = {}
    for warning in warnings:
        by_message.setdefault(warning.message, []).append(warning)
    out = []
    for message, items in by_message.items():
        names = _names(manifest, [Path(w.file) for w in items])
        hint = f" ({items[0].hint})" if items[0].hint else ""
        out.append(f"{len(items)} file(s) {message}: {names}{hint}")
    return out


def _note_kind(
    manifest: SiteManifest, path: Path, kinds: dict[tuple[str, str], list[Path]]
) -> ImageInfo:
    """Record a photo that is not plain 8-bit RGB, or that is smaller than the model's input;
    returns what its header says."""
    info = image_info(path)
    if info.kind is not None:
        kinds.setdefault(info.kind, []).append(path)
    size = int(getattr(manifest.preprocess, "image_size", 0) or 0)
    if min(info.size) < size:
        how = f"smaller than image_size {size} px, upscaled and so blurred"
        kinds.setdefault(("tiny", how), []).append(path)
    return info


def _unlike_warnings(
    manifest: SiteManifest, unlike: dict[tuple[str, ...], list[Path]]
) -> list[str]:
    """One warning naming the scans that do not look like the site's modality, and why."""
    if not unlike:
        return []
    paths = sorted(p for group in unlike.values() for p in group)
    doubts = list(dict.fromkeys(d for group in unlike for d in group))
    cropped = (
        " (a photo cropped inside the camera field has no dark surround and is still a fundus "
        "photo)"
        if str(manifest.modality) == "fundus"
        else ""
    )
    return [
        f"{len(paths)} scan(s) do not look like {manifest.modality} scans ({'; '.join(doubts)}): "
        f"{_names(manifest, paths)}; check that they belong to this site{cropped}"
    ]


def _cross_site_duplicates(reports: list[SiteReport]) -> None:
    """Warn each site holding byte-identical copies of another site's scans, naming the pairs:
    a scan in two sites is in two test sets, and lifts both sites' figures."""
    owners: dict[str, list[tuple[SiteReport, Path]]] = {}
    for report in reports:
        for content, path in report.contents.items():
            owners.setdefault(content, []).append((report, path))
    for report in reports:
        pairs: dict[str, list[str]] = {}
        for content, path in report.contents.items():
            for other, theirs in owners[content]:
                if other is not report:
                    pairs.setdefault(other.site, []).append(f"{path} = {theirs}")
        for site, listed in pairs.items():
            more = f"; ... and {len(listed) - _SHOWN} more" if len(listed) > _SHOWN else ""
            report.warnings.append(
                printable(
                    f"{len(listed)} scan(s) byte-identical to scans of site {site} (same "
                    f"SHA-256): {'; '.join(listed[:_SHOWN])}{more}; a scan in two sites is in "
                    "both test sets and lifts both sites' figures: remove the copies unless the "
                    "two sites truly share these patients"
                )
            )


def _duplicate_warnings(
    manifest: SiteManifest, records: list[Record], contents: list[str]
) -> list[str]:
    """A warning listing byte-identical scans saved under different names."""
    by_content: dict[str, list[Path]] = {}
    for record, content in zip(records, contents, strict=True):
        by_content.setdefault(content, []).append(record.path)
    groups = [paths for paths in by_content.values() if len(paths) > 1]
    if not groups:
        return []
    listed = "; ".join(" = ".join(_names(manifest, g).split(", ")) for g in groups[:_SHOWN])
    more = f"; ... and {len(groups) - _SHOWN} more" if len(groups) > _SHOWN else ""
    n_files = sum(len(g) for g in groups)
    return [
        f"{len(groups)} set(s) of byte-identical scans under different names ({n_files} files): "
        f"{listed}{more}; each set is kept in one split, remove the copies unless intended"
    ]


def _count(
    manifest: SiteManifest, records: list, report: SiteReport, contents: list[str] | None
) -> None:
    by_index = manifest.class_names()
    # Classes in the order the manifest declares them: how the report lists them.
    class_name = {i: by_index[i] for i in dict.fromkeys(manifest.labels.values())}
    try:
        splits = assign_splits(records, manifest.split, contents=contents)
    except MedfedError as exc:
        report.problems.append(Problem(str(manifest.root), str(exc)))
        return
    counts = {str(s): dict.fromkeys(class_name.values(), 0) for s in Split if s in splits}
    for record, split in zip(records, splits, strict=True):
        counts[str(split)][class_name[record.label]] += 1
    report.counts = counts
    totals = Counter(class_name[r.label] for r in records)
    report.problems.extend(_class_problems(manifest, class_name, totals))
    held = manifest.held_indices()
    if len(held) < len(class_name):
        report.warnings.append(_subset_warning(manifest, [class_name[i] for i in sorted(held)]))
    held_counts = {
        split: {name: n for name, n in per.items() if manifest.labels.get(name) in held}
        for split, per in counts.items()
    }
    if len(held) > 1:  # a one-class site's splits hold one class by its declaration
        report.warnings.extend(split_warnings(held_counts, by_index))
    if "train" in counts and ("val" not in counts or sum(counts["val"].values()) == 0):
        report.warnings.append(_no_validation_warning(manifest))
    if "train" not in counts or sum(counts["train"].values()) == 0:
        report.problems.append(Problem(str(manifest.root), "training split is empty"))
    if "test" not in counts or sum(counts["test"].values()) == 0:
        # training refuses such a site (sitedata.load_site): say so before it is tried
        report.problems.append(
            Problem(
                str(manifest.root),
                "the test split is empty",
                f"adjust [split] in {manifest.manifest_path or 'the manifest'} "
                "(test_fraction), or add scans",
            )
        )


def _class_problems(
    manifest: SiteManifest, class_name: dict[int, str], totals: Counter[str]
) -> list[Problem]:
    """A declared class the site should hold but has no scans of, and scans of a class that
    ``classes_held`` leaves out."""
    held = manifest.held_indices()
    where = manifest.manifest_path or "the manifest"
    out = []
    for index, name in class_name.items():
        if totals[name] == 0 and index in held:
            out.append(
                Problem(
                    str(manifest.root),
                    f"no scans of class '{name}'",
                    "a site needs examples of every class it holds; add them, or (when the "
                    "federation's other sites hold it) list the classes this site does hold "
                    f"in classes_held of {where}",
                )
            )
        elif totals[name] and index not in held:
            out.append(
                Problem(
                    str(manifest.root),
                    f"{totals[name]} scan(s) of class '{name}', which classes_held "
                    f"{list(manifest.classes_held)} leaves out",
                    f"add '{name}' to classes_held in {where}, or remove those scans",
                )
            )
    return out


def _subset_warning(manifest: SiteManifest, held: list[str]) -> str:
    """What holding only some of the federation's classes means for a site's own figures."""
    one = len(held) == 1
    return (
        f"site {manifest.id} holds scans of {', '.join(held)} only (classes_held), not of "
        f"every class of [labels]: its own "
        + ("AUC is undefined (one class)" if one else "figures cover those classes only")
        + "; it still trains the shared model, and the federation's other sites hold the rest"
    )


def _no_validation_warning(manifest: SiteManifest) -> str:
    """Why an empty validation split matters: what training falls back to on this site."""
    where = manifest.manifest_path or "the manifest"
    fraction = manifest.split.val_fraction
    why = " ([split] val_fraction = 0)" if fraction == 0 else ""
    return (
        f"site {manifest.id} has no validation split{why}: training cannot tune its operating "
        "rule on it, so "
        "the site's operating threshold stays at 0.5 and no validation AUC is reported; set "
        f"[split] val_fraction (e.g. 0.15) in {where}, or add scans, to tune it"
    )


def split_warnings(counts: dict[str, dict[str, int]], by_index: dict[int, str]) -> list[str]:
    """What a site's split counts warn of: a split holding one class, too few of a class."""
    out = []
    for split, per in counts.items():
        present = [k for k, v in per.items() if v > 0]
        if len(present) < 2:
            out.append(f"{split} split has only class {present}: its AUC will be undefined")
    return out + _small_split_warnings(counts, by_index)


def _small_split_warnings(counts: dict[str, dict[str, int]], by_index: dict[int, str]) -> list[str]:
    """A warning for each split with fewer than RELIABLE_MIN positives or negatives.

    Binary sites: class 1 is the positive class. With more classes each class is taken one
    against the rest, as the macro AUC does. Figures computed on such a split are flagged
    unreliable in the evaluation, so the site is still ready (a warning, not a problem).
    """
    out = []
    binary = len(by_index) == 2
    for split, per in counts.items():
        total = sum(per.values())
        if binary:
            pos_name, neg_name = by_index[1], by_index[0]
            n_pos, n_neg = per[pos_name], per[neg_name]
            why = unreliable(n_pos, n_neg)
            if why:
                out.append(
                    f"{split} split has {n_pos} positive ('{pos_name}') and {n_neg} negative "
                    f"('{neg_name}') scans, {why}: figures on it will be flagged unreliable "
                    f"(each class needs at least {RELIABLE_MIN})"
                )
            continue
        small = [
            f"'{name}' against the rest has {why}"
            for name, n in per.items()
            if (why := unreliable(n, total - n))
        ]
        if small:
            out.append(
                f"{split} split: {'; '.join(small)}: figures on it will be flagged unreliable "
                f"(each class and the rest need at least {RELIABLE_MIN})"
            )
    return out


def _site_distances(reports: list[SiteReport]) -> None:
    """Fill each report's distances to the other sites of its modality."""
    sites = [SiteFeatures(r.site, r.modality, r.features) for r in reports]
    for report, distances in zip(reports, site_distances(sites), strict=True):
        report.distances = distances


def check_manifests(paths: list[str | Path], cache: TensorCache) -> list[SiteReport]:
    """Check each manifest, in the order given; an unusable manifest is reported, not raised.

    Two manifests with one site id are refused (ManifestError naming both files): every
    report, distance and run tells sites apart by their id.
    """
    loaded: list[SiteManifest | SiteReport] = []
    first_with_id: dict[str, Path | str] = {}
    for path in paths:
        try:
            manifest = load_manifest(path)
        except MedfedError as exc:
            loaded.append(_escaped(SiteReport(manifest=str(path), unusable=str(exc))))
            continue
        other = first_with_id.setdefault(manifest.id, path)
        if other is not path:
            if Path(other).resolve() == Path(path).resolve():
                raise ManifestError(
                    f"{path} is given twice; pass each site's manifest once "
                    f"(site id {manifest.id!r})"
                )
            raise ManifestError(
                f"site id {manifest.id!r} is used by both {other} and {path}; give each site "
                "its own 'id'"
            )
        loaded.append(manifest)
    reports = [item if isinstance(item, SiteReport) else check_site(item, cache) for item in loaded]
    _site_distances(reports)
    _cross_site_duplicates(reports)
    federation_photo_warnings(reports)
    return reports


def overall_exit_code(reports: list[SiteReport]) -> int:
    return max((r.exit_code for r in reports), default=EXIT_READY)
