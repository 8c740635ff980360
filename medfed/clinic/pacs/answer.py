"""The answer written back to the PACS: a DICOM Basic Text Structured Report in the scan's study.

It shares the study's patient and study identifiers (so every viewer shows it beside the
study), is a new series (Modality SR, "medfed routing answer"), references the routed series
and instances (Current Requested Procedure Evidence), and holds the answer as text items:
status, chosen site, prediction at the site's operating point, the site posterior, the audit
id, and the whole answer as ``medfed route --json`` prints it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from medfed import __version__

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"
SERIES_DESCRIPTION = "medfed routing answer"
SCHEME = "99MEDFED"  # private coding scheme of the items below
# (code, meaning) of each text item, in the order written.
ITEMS = (
    ("status", "Routing status"),
    ("site", "Answering site"),
    ("prediction", "Prediction"),
    ("operating", "Operating point"),
    ("posterior", "Site posterior"),
    ("audit", "Audit id"),
    ("model", "Model"),
    ("json", "Answer (JSON)"),
    ("notice", "Notice"),
)
NOTICE = (
    "Answer of a federated model routed by medfed, for review by a clinician; it is not a "
    "diagnosis."
)
# Patient and study attributes copied from the scan, so the report files into its study.
_COPIED = (
    "PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyInstanceUID",
    "StudyDate", "StudyTime", "AccessionNumber", "ReferringPhysicianName", "StudyID",
    "IssuerOfPatientID",
)  # fmt: skip


def _code(value: str, meaning: str, scheme: str = SCHEME) -> Dataset:
    from pydicom.dataset import Dataset

    code = Dataset()
    code.CodeValue = value
    code.CodingSchemeDesignator = scheme
    code.CodeMeaning = meaning
    return code


def _text(value: str, meaning: str, text: str) -> Dataset:
    from pydicom.dataset import Dataset

    item = Dataset()
    item.RelationshipType = "CONTAINS"
    item.ValueType = "TEXT"
    item.ConceptNameCodeSequence = [_code(value, meaning)]
    item.TextValue = text
    return item


def answer_texts(answer: dict[str, Any], run_name: str) -> dict[str, str]:
    """The report's text items (code -> text) for ``answer`` (route --json's object + audit_id)."""
    probs = answer.get("site_probs") or {}
    posterior = ", ".join(
        f"{site} {p:.3f}" if isinstance(p, float) else f"{site} n/a" for site, p in probs.items()
    )
    prob = answer.get("prediction_prob")
    prediction = answer.get("prediction")
    shown = {k: v for k, v in answer.items() if k != "nearest"}  # never an answer in the PACS
    if answer.get("status") == "abstained":
        prediction = prob = None
        shown.update(prediction=None, prediction_prob=None, class_probs=None)
    rule = answer.get("decision_rule")
    texts = {
        "status": str(answer.get("status")),
        "site": str(answer.get("chosen_site") or "none (no site answers this scan)"),
        "prediction": (
            f"{prediction} (P({prediction}) {prob:.3f}; decided by {rule or 'argmax'})"
            if prediction is not None and prob is not None
            else _no_prediction(answer)
        ),
        "operating": str(answer.get("reason") or "n/a"),
        "posterior": posterior or "n/a",
        "audit": f"{answer.get('audit_id')} (run {run_name})",
        "model": str(answer.get("model") or "not recorded"),
        "json": json.dumps(shown, sort_keys=True, allow_nan=False),
        "notice": NOTICE,
    }
    return texts


def _no_prediction(answer: dict[str, Any]) -> str:
    if answer.get("status") == "abstained":
        return "none: abstained (no site fits this scan), so no answer is given"
    return "none"


def answer_report(
    answer: dict[str, Any], run_name: str, scan: Dataset, instances: Sequence[Dataset]
) -> Dataset:
    """A Basic Text SR holding ``answer`` in the study of ``scan`` (any instance of it),
    referencing ``instances`` (the routed ones)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    now = datetime.now(UTC)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = BASIC_TEXT_SR
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.preamble = b"\0" * 128  # sent as a whole Part 10 file (STOW-RS writes what it is given)
    for keyword in _COPIED:
        if keyword in scan:
            setattr(ds, keyword, scan.data_element(keyword).value)
    ds.SOPClassUID = BASIC_TEXT_SR
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.SeriesInstanceUID = generate_uid()
    ds.Modality = "SR"
    ds.SeriesNumber = 9901
    ds.InstanceNumber = 1
    ds.SeriesDescription = SERIES_DESCRIPTION
    ds.Manufacturer = "medfed"
    ds.SoftwareVersions = __version__
    ds.ContentDate = ds.SeriesDate = now.strftime("%Y%m%d")
    ds.ContentTime = ds.SeriesTime = now.strftime("%H%M%S")
    ds.ValueType = "CONTAINER"
    ds.ContinuityOfContent = "SEPARATE"
    ds.CompletionFlag = "COMPLETE"
    ds.VerificationFlag = "UNVERIFIED"
    ds.ConceptNameCodeSequence = [_code("18748-4", "Diagnostic imaging report", "LN")]
    texts = answer_texts(answer, run_name)
    ds.ContentSequence = [_text(code, meaning, texts[code]) for code, meaning in ITEMS]
    ds.CurrentRequestedProcedureEvidenceSequence = [_evidence(scan, instances)]
    ds.ReferencedPerformedProcedureStepSequence = []
    ds.PerformedProcedureCodeSequence = []
    return ds


def _evidence(scan: Dataset, instances: Sequence[Dataset]) -> Dataset:
    from pydicom.dataset import Dataset

    series = Dataset()
    series.SeriesInstanceUID = scan.SeriesInstanceUID
    refs = []
    for one in instances:
        ref = Dataset()
        ref.ReferencedSOPClassUID = one.SOPClassUID
        ref.ReferencedSOPInstanceUID = one.SOPInstanceUID
        refs.append(ref)
    series.ReferencedSOPSequence = refs
    study = Dataset()
    study.StudyInstanceUID = scan.StudyInstanceUID
    study.ReferencedSeriesSequence = [series]
    return study


def read_answer(report: Dataset) -> dict[str, str]:
    """The text items of a report written by :func:`answer_report` (code -> text)."""
    return {
        item.ConceptNameCodeSequence[0].CodeValue: str(item.TextValue)
        for item in report.get("ContentSequence", [])
        if item.get("ValueType") == "TEXT"
    }
