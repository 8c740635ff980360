"""Answer one scan that came from a PACS: route it, record it, write the answer, send it back.

Both inboxes (the DICOMweb watcher, the DICOM listener) hand each scan here: a CT series, or
one photo. The order makes a crash harmless: the decision is committed to the audit log, then
the answer is written to ``RUN/pacs/answers/`` and the scan recorded as pending in
``RUN/pacs.sqlite``, and only then sent; a restart finds a pending scan and sends the same
answer again instead of routing the scan twice.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from medfed.clinic.kept import keep_scan, keep_series
from medfed.clinic.pacs.answer import answer_report
from medfed.clinic.pacs.instances import (
    DICOM_MODALITIES,
    PHOTO_MODALITIES,
    Ids,
    kind_of,
    modality_of,
    uid,
    write_photo,
    write_series,
)
from medfed.clinic.pacs.records import PacsLog, PacsScan, now
from medfed.clinic.pacs.visits import Visit, visit_of
from medfed.clinic.recorded import record_scan
from medfed.clinic.releases import LiveModel
from medfed.core.errors import DataError
from medfed.core.fileio import private_dir, private_file
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import Router

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

__all__ = ["Inbox", "Outcome", "ids_of", "wrong_modality"]

ANSWERS = Path("pacs") / "answers"
Send = Callable[["Dataset"], None]


@dataclass(frozen=True)
class Outcome:
    """What an inbox did with one scan; ``new``: False when it had been handled before."""

    scan: PacsScan
    new: bool

    def describe(self) -> str:
        s = self.scan
        where = f"study {s.study_uid} series {s.series_uid}"
        if s.instance_uid:
            where += f" instance {s.instance_uid}"
        if s.status == "skipped":
            return f"skipped {where} ({s.modality}): {s.reason}"
        return f"answered {where} ({s.modality}): audit id {s.audit_id}, report {s.answer_uid}"


def ids_of(ds: Dataset, photo: bool) -> Ids:
    """The scan's identifiers; DataError when one is missing or malformed."""
    return Ids(
        uid(ds.get("StudyInstanceUID"), "StudyInstanceUID"),
        uid(ds.get("SeriesInstanceUID"), "SeriesInstanceUID"),
        uid(ds.get("SOPInstanceUID"), "SOPInstanceUID") if photo else None,
    )


def wrong_modality(modality: str, fed_modality: str) -> str:
    wanted = "/".join(sorted(DICOM_MODALITIES.get(fed_modality, ())))
    return f"wrong modality: {modality or 'none given'}; this run answers {fed_modality} ({wanted})"


@dataclass
class Inbox:
    """One run answering scans from one PACS source (a DICOMweb URL, or a listener's AE)."""

    run: Path
    fed: TrainedFederation
    router: Router
    source: str
    patient_ids: str = "hash"  # how the review names the patient (medfed.clinic.pacs.visits)
    # the run's served model, replaced in place by medfed ops promote / rollback
    live: LiveModel | None = None

    @property
    def log(self) -> PacsLog:
        return PacsLog(self.run)

    def visit(self, ds: Dataset | None) -> Visit:
        return Visit() if ds is None else visit_of(ds, self.run, self.patient_ids)

    def skip(self, ids: Ids, modality: str, reason: str, ds: Dataset | None = None) -> Outcome:
        """Record ``ids`` as skipped (once: a scan skipped before is left as it was)."""
        found = self.log.get(ids.key)
        if found is not None:
            return Outcome(found, new=False)
        v = self.visit(ds)
        scan = PacsScan(
            ids.key, self.source, ids.study, ids.series, ids.instance, modality, "skipped",
            reason, time=now(), accession=v.accession, patient=v.patient,
            study_date=v.study_date,
        )  # fmt: skip
        self.log.put(scan)
        return Outcome(scan, new=True)

    def handle(self, instances: Sequence[Dataset], send: Send) -> Outcome:
        """Answer one scan (a CT series' instances, or one photo) unless it was answered."""
        if self.live is not None:
            self.fed, self.router = self.live.current()
        first = instances[0]
        modality = modality_of(first)
        photo = modality in PHOTO_MODALITIES
        ids = ids_of(first, photo)
        found = self.log.get(ids.key)
        if found is not None and found.status == "pending":
            return self._resend(found, send)
        if found is not None:
            return Outcome(found, new=False)
        if kind_of(modality) != self.fed.modality:
            return self.skip(ids, modality, wrong_modality(modality, self.fed.modality), first)
        with tempfile.TemporaryDirectory(prefix="medfed-pacs-") as folder:
            try:
                path = (
                    write_photo(first, Path(folder), f"instance {ids.instance}")
                    if photo
                    else write_series(list(instances), Path(folder) / "series")
                )
            except (DataError, OSError, ValueError, AttributeError) as exc:
                return self.skip(ids, modality, f"unreadable: {exc}", first)
            done = record_scan(self.fed, self.router, path, self.run, name=ids.name)
            if photo and done.entry.status != "error":
                keep_scan(self.run, path, done.entry.sha256, "photo.png")
            elif done.entry.status != "error":  # the series itself, for the Review page
                keep_series(self.run, path, done.entry.sha256)
        v = self.visit(first)
        scan = PacsScan(
            ids.key, self.source, ids.study, ids.series, ids.instance, modality, "skipped",
            done.entry.reason, done.audit_id, time=now(), accession=v.accession,
            patient=v.patient, study_date=v.study_date,
        )  # fmt: skip
        if done.entry.status == "error":  # recorded in the audit log; nothing to answer
            scan = replace(scan, reason=f"unreadable: {done.entry.reason}")
            self.log.put(scan)
            return Outcome(scan, new=True)
        report = answer_report(done.to_dict(), self.run.resolve().name, first, instances)
        answers = self.run / ANSWERS
        private_dir(answers)
        file = answers / f"{report.SOPInstanceUID}.dcm"
        report.save_as(file, enforce_file_format=True)
        private_file(file)
        pending = replace(
            scan, status="pending", reason=None, answer_uid=str(report.SOPInstanceUID),
            answer_file=str(file),
        )  # fmt: skip
        self.log.put(pending)
        return self._send(pending, report, send)

    def _resend(self, pending: PacsScan, send: Send) -> Outcome:
        import pydicom

        report = pydicom.dcmread(pending.answer_file or "")
        return self._send(pending, report, send)

    def _send(self, pending: PacsScan, report: Dataset, send: Send) -> Outcome:
        send(report)  # an error leaves the scan pending: the next poll sends it again
        answered = replace(pending, status="answered", time=now())
        self.log.put(answered)
        return Outcome(answered, new=True)
