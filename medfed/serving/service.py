"""``medfed route``: answer new patient scans with a trained federation, and log each decision."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from medfed.data.cache import content_hash
from medfed.data.preprocess import apply_pipeline
from medfed.errors import MedfedError
from medfed.serving.audit import AuditEntry, AuditLog
from medfed.serving.bundle import TrainedFederation
from medfed.serving.routers import MajorityVoteRouter, Router, RouteResult
from medfed.serving.scans import Scan, read_scan


@dataclass
class RoutedScan:
    """The answer for one file (status: routed, abstained or error)."""

    entry: AuditEntry

    def to_dict(self) -> dict[str, Any]:
        return self.entry.to_dict()

    def describe(self) -> str:
        e = self.entry
        if e.status == "error":
            return f"{e.file}: error: {e.reason}"
        probs = ", ".join(f"{site} {p:.2f}" for site, p in e.site_probs.items())
        if e.status == "abstained":
            head = f"{e.file}: abstain ({e.reason})"
        else:
            head = (
                f"{e.file}: routed to {e.chosen_site} -> {e.prediction} ({e.prediction_prob:.2f})"
            )
            if e.reason:
                head += f"\n    {e.reason}"
        return f"{head}\n    site probabilities: {probs}"


def views_for(fed: TrainedFederation, scan: Scan) -> list[torch.Tensor]:
    """The scan as each site sees it: that site's pipeline, then its normalization."""
    views = []
    for site in fed.sites:
        raw = apply_pipeline(site.manifest.modality, site.manifest.preprocess, scan.decoded)
        views.append(site.normalization.apply(raw[None]))
    return views


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _entry(path: Path, router: Router, status: str, **fields: Any) -> AuditEntry:
    values: dict[str, Any] = {
        "sha256": "",
        "chosen_site": None,
        "site_probs": {},
        "prediction": None,
        "prediction_prob": None,
        "ood_score": None,
        "reason": None,
    }
    values.update(fields)
    return AuditEntry(time=_now(), file=str(path), router=router.name, status=status, **values)


def route_one(
    fed: TrainedFederation, router: Router, path: Path, name: str | None = None
) -> AuditEntry:
    """Route one file; every failure becomes an 'error' entry that names the file.

    ``name``: how the answer and the audit log name the file (default: its path), e.g. the
    original name of an upload saved to a temporary folder.
    """
    if name is not None:
        entry = route_one(fed, router, path)
        reason = entry.reason.replace(str(path), name) if entry.reason else entry.reason
        return replace(entry, file=name, reason=reason)
    try:
        scan = read_scan(path)
        digest = content_hash(scan.files)
    except MedfedError as exc:
        return _entry(path, router, "error", reason=str(exc))
    if str(scan.modality) != fed.modality:
        reason = f"a {scan.modality} scan, but this federation was trained on {fed.modality}"
        return _entry(path, router, "abstained", sha256=digest, reason=reason)
    try:
        result = router.route(fed, views_for(fed, scan))
    except (MedfedError, RuntimeError, ValueError) as exc:
        reason = f"cannot be preprocessed or answered ({exc})"
        return _entry(path, router, "error", sha256=digest, reason=reason)
    site_ids = [s.id for s in fed.sites]
    score = float(result.ood_score[0])
    prediction = int(result.prediction[0])
    answer = {
        "sha256": digest,
        "site_probs": {
            sid: float(p) for sid, p in zip(site_ids, result.site_probs[0], strict=True)
        },
        "prediction": fed.class_names()[prediction],
        "prediction_prob": float(result.class_probs[0, prediction]),
        "ood_score": score if score == score else None,  # NaN when uncalibrated
    }
    if bool(result.abstained[0]):
        threshold = fed.abstention.threshold if fed.abstention else float("nan")
        reason = f"no site fits: distance {score:.2f} above the threshold {threshold:.2f}"
        return _entry(path, router, "abstained", reason=reason, **answer)
    chosen = site_ids[int(result.routed[0])]
    reason = _operating_words(fed, router, result)
    return _entry(path, router, "routed", chosen_site=chosen, reason=reason, **answer)


def _operating_words(fed: TrainedFederation, router: Router, result: RouteResult) -> str | None:
    """How a two-class answer was decided: P(positive) against the answering threshold."""
    thresholds = fed.thresholds
    if thresholds is None or result.class_probs.shape[1] != 2:
        return None
    positive = fed.class_names()[1]
    p = float(result.class_probs[0, 1])
    if isinstance(router, MajorityVoteRouter):
        return f"P({positive}) {p:.2f} averaged; each site voted at its own operating threshold"
    t = float(router.answer_threshold(thresholds, result.site_probs)[0])
    side = "at or above" if p >= t else "below"
    return f"P({positive}) {p:.2f}, {side} the operating threshold {t:.2f}"


def route_files(
    fed: TrainedFederation,
    router: Router,
    files: list[Path],
    run_dir: Path | None,
    names: list[str] | None = None,
) -> list[RoutedScan]:
    """Route every file (one bad file never stops the others) and append them to the audit log.

    The audit log is written before answers are shown: a decision that cannot be logged raises
    (AuditError) rather than reach a clinician unrecorded. ``names``: see ``route_one``.
    """
    shown = names if names is not None else [None] * len(files)
    entries = [route_one(fed, router, Path(f), n) for f, n in zip(files, shown, strict=True)]
    if run_dir is not None:
        AuditLog(run_dir).append(entries)
    return [RoutedScan(e) for e in entries]
