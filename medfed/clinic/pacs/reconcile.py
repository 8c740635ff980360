"""``medfed pacs backfill``: every study in the PACS, each scan answered, skipped or pending.

The PACS is swept whole (QIDO-RS, every study whatever its date) and each scan the watcher
would answer (a CT series, or one photo) is read against ``RUN/pacs.sqlite``: *answered* (its
audit id and report), *skipped* (with why: another modality, unreadable), or *pending* (not
yet answered, or routed but its answer not yet stored in the PACS). With ``answer`` the
pending studies are answered as the watcher answers them, once each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from medfed.clinic.pacs.finding import all_studies
from medfed.clinic.pacs.handling import wrong_modality
from medfed.clinic.pacs.instances import NOT_IMAGES, PHOTO_MODALITIES, Ids, kind_of
from medfed.clinic.pacs.records import PacsScan
from medfed.clinic.pacs.watcher import DicomwebWatcher

__all__ = ["STATUSES", "Row", "count_rows", "survey"]

STATUSES = ("answered", "skipped", "pending")
_STUDY_UID, _SERIES_UID, _MODALITY, _SOP_UID = "0020000D", "0020000E", "00080060", "00080018"


@dataclass(frozen=True)
class Row:
    """One scan (or a study with no scan medfed reads) and where it stands."""

    study: str
    series: str | None
    instance: str | None
    modality: str
    status: str  # answered, skipped, pending
    why: str
    audit_id: int | None = None
    report: str | None = None
    new: bool = False  # answered or skipped by this backfill

    def describe(self) -> str:
        where = f"study {self.study}"
        where += f" series {self.series}" if self.series else ""
        where += f" instance {self.instance}" if self.instance else ""
        now = " (just now)" if self.new else ""
        return f"{self.status:<8} {where} ({self.modality or 'no images'}): {self.why}{now}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _value(obj: dict[str, Any], tag: str) -> str:
    values = (obj.get(tag) or {}).get("Value") or [""]
    return str(values[0] if values[0] is not None else "").strip()


def _from_log(ids: Ids, modality: str, scan: PacsScan | None) -> Row:
    if scan is None:
        return Row(ids.study, ids.series, ids.instance, modality, "pending", "not yet answered")
    if scan.status == "pending":
        why = f"routed (audit id {scan.audit_id}); its answer is not yet stored in the PACS"
        return Row(ids.study, ids.series, ids.instance, modality, "pending", why, scan.audit_id)
    if scan.status == "skipped":
        return Row(ids.study, ids.series, ids.instance, modality, "skipped", scan.reason or "")
    why = f"audit id {scan.audit_id}, report {scan.answer_uid}"
    return Row(
        ids.study, ids.series, ids.instance, modality, "answered", why, scan.audit_id,
        scan.answer_uid,
    )  # fmt: skip


def _series_rows(watcher: DicomwebWatcher, ids: Ids, modality: str) -> list[Row]:
    log = watcher.inbox.log
    recorded = log.get(ids.key)  # a CT series, or a series skipped as a whole
    if recorded is not None and (recorded.status != "pending" or modality not in PHOTO_MODALITIES):
        return [_from_log(ids, modality, recorded)]
    wanted = watcher.inbox.fed.modality
    if kind_of(modality) != wanted:
        why = wrong_modality(modality, wanted) + " (not yet recorded)"
        return [Row(ids.study, ids.series, None, modality, "skipped", why)]
    if modality not in PHOTO_MODALITIES:
        return [_from_log(ids, modality, None)]
    listed = watcher.call(
        f"listing the instances of series {ids.series} (QIDO-RS)",
        lambda: watcher.client.search_for_instances(
            ids.study, ids.series, fields=["SOPInstanceUID"]
        ),
    )
    rows = []
    for one in listed:
        photo = Ids(ids.study, ids.series, _value(one, _SOP_UID))
        rows.append(_from_log(photo, modality, log.get(photo.key)))
    return rows or [Row(ids.study, ids.series, None, modality, "skipped", "the series is empty")]


def study_rows(watcher: DicomwebWatcher, study: str) -> list[Row]:
    """Where each scan of ``study`` stands; one skipped row when it holds no image series."""
    series = watcher.call(
        f"listing the series of study {study} (QIDO-RS)",
        lambda: watcher.client.search_for_series(study, fields=["Modality"]),
    )
    rows, passed = [], []
    for one in series:
        modality, uid = _value(one, _MODALITY).upper(), _value(one, _SERIES_UID)
        if modality in NOT_IMAGES:
            passed.append(modality)
            continue
        rows += _series_rows(watcher, Ids(study, uid), modality)
    if not rows:
        what = ", ".join(sorted(set(passed))) or "no series"
        rows = [Row(study, None, None, "", "skipped", f"no image series medfed reads ({what})")]
    return rows


def survey(watcher: DicomwebWatcher, answer: bool = False) -> Iterator[Row]:
    """Every scan of every study in the PACS; with ``answer``, the pending ones are answered
    first (their rows marked ``new``)."""
    for page in all_studies(watcher.inbox.source, watcher.client):
        for study in (_value(s, _STUDY_UID) for s in page):
            if not study:
                continue
            rows = study_rows(watcher, study)
            if answer and any(r.status == "pending" for r in rows):
                done = {o.scan.key for o in watcher.answer_study(study) if o.new}
                rows = [
                    replace(r, new=Ids(r.study, r.series or "", r.instance).key in done)
                    for r in study_rows(watcher, study)
                ]
            yield from rows


def count_rows(rows: list[Row]) -> dict[str, int]:
    """Studies and scans by status."""
    counts = Counter(r.status for r in rows)
    return {"studies": len({r.study for r in rows}), **{s: counts.get(s, 0) for s in STATUSES}}
