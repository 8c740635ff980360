"""How the review lists a scan from a PACS: its accession number, a patient identifier and its
study date, as a clinician finds the study in the PACS, rather than its three UIDs.

The patient identifier follows the run's policy (``--patient-ids``):

* ``hash`` (the default): a keyed hash of the PatientID (HMAC-SHA-256 with a key kept
  owner-only in ``RUN/pacs/patient-id.key``, made on first use), ``h:`` and 12 hex digits. One
  patient's scans share it within the run, so the review can group them, while the run's files
  never hold the ID; the PACS operator recovers a patient from the accession number.
* ``plain``: the PatientID as the PACS holds it;
* ``none``: no patient identifier is kept.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medfed.core.errors import ConfigError
from medfed.core.fileio import private_dir

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

PATIENT_POLICIES = ("hash", "plain", "none")
KEY_FILE = Path("pacs") / "patient-id.key"


def check_policy(value: str) -> str:
    if value not in PATIENT_POLICIES:
        raise ConfigError(f"--patient-ids {value!r}: one of {', '.join(PATIENT_POLICIES)}")
    return value


@dataclass(frozen=True)
class Visit:
    """What the review lists a PACS scan by."""

    accession: str = ""
    patient: str = ""
    study_date: str = ""  # YYYY-MM-DD, or empty

    def label(self) -> str:
        """``accession A1, patient h:0a1b..., 2026-12-01`` (the parts the scan has)."""
        parts = [f"accession {self.accession}" if self.accession else ""]
        parts.append(f"patient {self.patient}" if self.patient else "")
        parts.append(self.study_date)
        return ", ".join(p for p in parts if p)


def _key(run: Path) -> bytes:
    path = Path(run) / KEY_FILE
    if path.is_file():
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    private_dir(path.parent)
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return key


def patient_token(run: Path, patient_id: str) -> str:
    """The run's keyed hash of ``patient_id`` (see the module docstring)."""
    digest = hmac.new(_key(run), patient_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"h:{digest[:12]}"


def _text(ds: Dataset, keyword: str) -> str:
    value: Any = ds.get(keyword, "")
    return str(value or "").strip()


def visit_of(ds: Dataset, run: Path, policy: str = "hash") -> Visit:
    """The scan's accession number, patient identifier (by ``policy``) and study date."""
    date = _text(ds, "StudyDate")
    shown = f"{date[:4]}-{date[4:6]}-{date[6:8]}" if len(date) == 8 and date.isdigit() else ""
    patient = _text(ds, "PatientID")
    if policy == "none" or not patient:
        patient = ""
    elif policy == "hash":
        patient = patient_token(run, patient)
    return Visit(_text(ds, "AccessionNumber")[:16], patient, shown)
