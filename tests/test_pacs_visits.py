"""How the review names a PACS scan: accession number, a patient identifier by policy (a keyed
hash by default), study date; and a PACS log of an older medfed gains those columns."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest
from pydicom.dataset import Dataset

from medfed.clinic.pacs.records import PACS_FILE, PacsLog, PacsScan
from medfed.clinic.pacs.visits import KEY_FILE, check_policy, patient_token, visit_of
from medfed.core.errors import ConfigError


def _ds(**attrs: str) -> Dataset:
    ds = Dataset()
    for key, value in attrs.items():
        setattr(ds, key, value)
    return ds


def test_the_patient_is_named_by_the_runs_policy(tmp_path: Path) -> None:
    ds = _ds(PatientID="MRN-0042", AccessionNumber="A77", StudyDate="20261130")

    hashed = visit_of(ds, tmp_path)
    assert hashed.accession == "A77" and hashed.study_date == "2026-11-30"
    assert hashed.patient.startswith("h:") and "0042" not in hashed.patient
    # stable within the run (one patient's scans group), keyed (another run differs)
    assert visit_of(ds, tmp_path).patient == hashed.patient == patient_token(tmp_path, "MRN-0042")
    other = tmp_path / "other"
    other.mkdir()
    assert patient_token(other, "MRN-0042") != hashed.patient
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert visit_of(ds, tmp_path, "plain").patient == "MRN-0042"
    assert visit_of(ds, tmp_path, "none").patient == ""
    assert hashed.label() == f"accession A77, patient {hashed.patient}, 2026-11-30"
    # what a study lacks stays blank, never invented
    bare = visit_of(_ds(StudyDate="2026-11"), tmp_path)
    assert (bare.accession, bare.patient, bare.study_date, bare.label()) == ("", "", "", "")
    with pytest.raises(ConfigError, match="--patient-ids 'clear'"):
        check_policy("clear")


def test_a_pacs_log_of_an_older_medfed_gains_the_new_columns(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / PACS_FILE) as db:  # the first schema, one scan answered
        db.execute(
            "CREATE TABLE scans (key TEXT PRIMARY KEY, source TEXT NOT NULL, study_uid TEXT "
            "NOT NULL, series_uid TEXT NOT NULL, instance_uid TEXT, modality TEXT NOT NULL, "
            "status TEXT NOT NULL, reason TEXT, audit_id INTEGER, answer_uid TEXT, answer_file "
            "TEXT, time TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO scans VALUES ('1.2/3.4', 'src', '1.2', '3.4', NULL, 'CT', 'answered', "
            "NULL, 1, '5.6', NULL, '2026-01-01T00:00:00+00:00')"
        )

    log = PacsLog(tmp_path)
    (old,) = log.scans()
    assert old.status == "answered" and (old.accession, old.patient, old.study_date) == ("",) * 3
    later = PacsScan("7.8/9.1", "src", "7.8", "9.1", None, "CT", "skipped", "why", time="t",
                     accession="A1", patient="h:abc", study_date="2026-02-02")  # fmt: skip
    log.put(later)
    assert log.get("7.8/9.1").accession == "A1"
