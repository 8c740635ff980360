"""``medfed route``: answer new patient scans with a trained federation, and log each decision."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.clinic.audit import AuditEntry, AuditLog
from medfed.config import FundusPreprocess
from medfed.core.errors import DataError, MedfedError
from medfed.core.names import printable
from medfed.core.progress import bar
from medfed.data.cache import content_hash, data_digest
from medfed.data.preprocess import apply_pipeline
from medfed.data.transforms import CameraField
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import MajorityVoteRouter, Router, RouteResult
from medfed.routing.scans import Scan, read_scan


@dataclass
class RoutedScan:
    """The answer for one file (status: routed, abstained or error)."""

    entry: AuditEntry

    def to_dict(self) -> dict[str, Any]:
        out = self.entry.to_dict()
        if out.get("audit_id") is None:  # not logged (--no-audit): no audit id to name
            out.pop("audit_id", None)
        if out.get("nearest") is None:
            out.pop("nearest", None)
        return out

    def describe(self) -> str:
        e = self.entry
        if e.status == "error":
            return f"{e.file}: error: {e.reason}"
        probs = ", ".join(f"{site} {p:.2f}" for site, p in e.site_probs.items())
        if e.status == "abstained":
            head = f"{e.file}: abstain ({e.reason}); no answer"
        else:
            head = (
                f"{e.file}: routed to {e.chosen_site} -> {e.prediction} "
                f"(P({e.prediction}) {e.prediction_prob:.2f}, decided by {e.decision_rule})"
            )
            if e.reason:
                head += f"\n    {e.reason}"
        return f"{head}\n    site probabilities: {probs}"


def views_for(fed: TrainedFederation, scan: Scan) -> list[torch.Tensor]:
    """The scan as each site sees it: that site's pipeline, then its normalization."""
    views = []
    encoded: dict[str, torch.Tensor] = {}  # the encoder runs once per distinct pipeline
    for site in fed.sites:
        _require_camera_field(site.manifest.preprocess, scan)
        raw = apply_pipeline(site.manifest.modality, site.manifest.preprocess, scan.decoded)
        if fed.encoder is not None:
            seen = data_digest(raw.contiguous())
            if seen not in encoded:
                encoded[seen] = fed.encoder.encode(raw[None])[0]
            raw = encoded[seen]
        views.append(site.normalization.apply(raw[None]))
    return views


def _require_camera_field(options: object, scan: Scan) -> None:
    """Refuse a photo in which the site's camera-field crop finds nothing (an all-black image)."""
    if not isinstance(options, FundusPreprocess) or not options.roi_crop:
        return
    if not isinstance(scan.decoded, np.ndarray) or scan.decoded.ndim != 3:
        return
    image = np.moveaxis(np.asarray(scan.decoded, dtype=np.float32), -1, 0)
    if not CameraField(options.roi_threshold)(image).any():
        raise DataError(
            f"{scan.path}: no camera field found: the image is all black; check that the "
            "photo was exported correctly"
        )


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
    if values["reason"] is not None:
        values["reason"] = printable(values["reason"])
    return AuditEntry(
        time=_now(), file=printable(str(path)), router=router.name, status=status, **values
    )


def _naming(path: Path, message: str) -> str:
    """``message``, led by the file's path unless it already names it."""
    return message if message.startswith(str(path)) else f"{path}: {message}"


def _cause(exc: BaseException) -> str:
    """The innermost cause of ``exc`` in words (MONAI wraps the real error in its own)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _not_finite(name: str, values: np.ndarray | torch.Tensor) -> str | None:
    """Words for NaN/infinite entries of ``values``, or None when every entry is finite."""
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values
    array = np.asarray(array, dtype=np.float64)
    bad = int((~np.isfinite(array)).sum())
    return f"{bad} of the {name} are NaN or infinite" if bad else None


def route_one(
    fed: TrainedFederation, router: Router, path: Path, name: str | None = None
) -> AuditEntry:
    """Route one file; every failure becomes an 'error' entry that names the file.

    NaN or infinite values anywhere (the preprocessed scan, the models' outputs, the
    out-of-distribution score) make an 'error' entry: such an answer is never reported as routed.

    ``name``: how the answer and the audit log name the file (default: its path), e.g. the
    original name of an upload saved to a temporary folder. Every entry names the model that
    gave it (``model``: the run's model id, see :meth:`medfed.runs.rundir.RunDir.model_id`).
    """
    entry = replace(_route_file(fed, router, path), model=fed.model_id)
    if name is not None:
        shown, named = printable(str(path)), printable(name)
        reason = entry.reason.replace(shown, named) if entry.reason else entry.reason
        return replace(entry, file=named, reason=reason)
    return entry


def _route_file(fed: TrainedFederation, router: Router, path: Path) -> AuditEntry:
    try:
        scan = read_scan(path)
        digest = content_hash(scan.files)
    except MedfedError as exc:
        return _entry(path, router, "error", reason=str(exc))
    except OSError as exc:  # the file changed or vanished while it was being read
        return _entry(path, router, "error", reason=f"{path}: cannot be read ({exc})")
    if str(scan.modality) != fed.modality:
        reason = f"a {scan.modality} scan, but this federation was trained on {fed.modality}"
        return _entry(path, router, "abstained", sha256=digest, reason=reason)
    try:
        views = views_for(fed, scan)
    except MedfedError as exc:
        return _entry(path, router, "error", sha256=digest, reason=_naming(path, str(exc)))
    except (RuntimeError, ValueError) as exc:
        reason = f"{path}: cannot be preprocessed ({_cause(exc)})"
        return _entry(path, router, "error", sha256=digest, reason=reason)
    problem = _not_finite("preprocessed values", torch.cat([v.flatten() for v in views]))
    if problem:
        reason = f"{path}: {problem}; the scan cannot be answered"
        return _entry(path, router, "error", sha256=digest, reason=reason)
    try:
        result = router.route(fed, views)
    except (MedfedError, RuntimeError, ValueError) as exc:
        reason = f"{path}: cannot be answered ({_cause(exc)})"
        return _entry(path, router, "error", sha256=digest, reason=reason)
    problem = _not_finite("site probabilities", result.site_probs[0]) or _not_finite(
        "class probabilities", result.class_probs[0]
    )
    if problem:
        reason = (
            f"{path}: the models' outputs are not numbers ({problem}); no answer is given. "
            "The run's weights may be damaged: check it with 'medfed evaluate' or retrain"
        )
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
        "class_probs": {
            name: float(p) for name, p in zip(fed.class_names(), result.class_probs[0], strict=True)
        },
        "ood_score": score if math.isfinite(score) else None,  # NaN when uncalibrated
    }
    threshold = fed.abstention.threshold if fed.abstention else float("nan")
    if fed.abstention is not None and (not math.isfinite(score) or math.isnan(threshold)):
        what = f"score is {score}" if not math.isfinite(score) else "threshold is NaN"
        reason = (
            f"{path}: the out-of-distribution {what}, so whether the scan fits any site is "
            "unknown; no answer is given. The run's abstention statistics may be damaged"
        )
        return _entry(path, router, "error", sha256=digest, reason=reason)
    rule = _decision_rule(fed, router, result)
    if bool(result.abstained[0]):
        reason = f"no site fits: distance {score:.2f} above the threshold {threshold:.2f}"
        nearest = {
            "note": NOT_AN_ANSWER,
            "site": site_ids[int(result.routed[0])],
            "prediction": answer.pop("prediction"),
            "prediction_prob": answer.pop("prediction_prob"),
            "class_probs": answer.pop("class_probs"),
            "decision_rule": rule,
        }
        return _entry(path, router, "abstained", reason=reason, nearest=nearest, **answer)
    chosen = site_ids[int(result.routed[0])]
    reason = _operating_words(fed, router, result)
    return _entry(
        path, router, "routed", chosen_site=chosen, reason=reason, decision_rule=rule, **answer
    )


NOT_AN_ANSWER = (
    "not an answer: no site fits this scan; the nearest site's model output, for review only"
)


def _decision_rule(fed: TrainedFederation, router: Router, result: RouteResult) -> str:
    """The rule that decided the class: argmax, or the answering site's operating threshold."""
    if fed.thresholds is None or result.class_probs.shape[1] != 2:
        return "argmax"
    positive = fed.class_names()[1]
    if isinstance(router, MajorityVoteRouter):
        return "majority vote, each site at its own operating threshold"
    t = float(router.answer_threshold(fed.thresholds, result.site_probs)[0])
    return f"operating threshold: {positive} when P({positive}) >= {t:.3f}"


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


def distinct(files: list[Path]) -> tuple[list[Path], dict[Path, int]]:
    """``files`` with repeats dropped (first one kept), and how often each repeat was given.

    Two paths are the same file when they resolve to the same place (``a.png`` and ``./a.png``).
    """
    kept: dict[Path, Path] = {}
    counts: dict[Path, int] = {}
    for f in files:
        key = Path(os.path.abspath(f))
        with contextlib.suppress(OSError, RuntimeError):  # a symlink loop: the plain path
            key = key.resolve()
        kept.setdefault(key, f)
        counts[key] = counts.get(key, 0) + 1
    return list(kept.values()), {kept[k]: n for k, n in counts.items() if n > 1}


def route_files(
    fed: TrainedFederation,
    router: Router,
    files: list[Path],
    run_dir: Path | None,
    names: list[str] | None = None,
    *,
    progress: bool = False,
) -> list[RoutedScan]:
    """Route every file (one bad file never stops the others) and append them to the audit log.

    The audit log is checked before the first scan and written before answers are shown: a
    decision that cannot be logged raises (AuditError) rather than reach a clinician unrecorded.
    ``names``: see ``route_one``. ``progress``: a bar over the files (on a terminal only).
    """
    log = AuditLog(run_dir) if run_dir is not None else None
    if log is not None:
        log.check()
    shown = names if names is not None else [None] * len(files)
    pairs = list(zip(files, shown, strict=True))
    entries = [
        route_one(fed, router, Path(f), n)
        for f, n in bar(pairs, "routing", show=progress and len(pairs) > 1, unit="scan")
    ]
    if log is not None:
        ids = log.append(entries)
        entries = [replace(e, audit_id=i) for e, i in zip(entries, ids, strict=True)]
    return [RoutedScan(e) for e in entries]
