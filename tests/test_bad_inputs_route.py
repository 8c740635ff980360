"""The bad-input corpus, ``medfed route`` cases (see tests/badinput.py for the policy).

Every row routes through a private copy of the shared run, so its audit log is its own. Besides
the rows: NaN anywhere (the models' outputs, the out-of-distribution score) is never reported
as routed, ``--json`` is strict JSON, file names that are not UTF-8 reach the audit log escaped.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pydicom.data
import pytest
from PIL import Image
from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic import audit
from medfed.clinic import route as service
from medfed.clinic.audit import AuditLog
from medfed.clinic.route import route_one
from medfed.core.errors import MedfedError
from medfed.routing.bundle import SiteOutputs, TrainedFederation
from medfed.routing.routers import DensityRatioRouter, MajorityVoteRouter
from medfed.routing.scans import read_scan
from medfed.runs.rundir import RunDir
from tests.badinput import Case, Shared, check

ROOT = os.geteuid() == 0  # root reads and writes any file: permission rows cannot fail for it


def _photo(s: Shared, i: int = 0) -> Path:
    """One of the shared synthetic fundus photos (read-only: copy it before changing it)."""
    return sorted((s.data / "ACRIMA").glob("*.jpg"))[i]


def _route(build, *extra: str):
    """`route` on a private copy of the run; ``build(tmp, shared)`` returns the files."""

    def make(tmp: Path, s: Shared) -> list:
        run = s.copy_run(tmp)
        return ["route", run, *build(tmp, s), *extra]

    return make


def _write(name: str, data: bytes):
    def build(tmp: Path, s: Shared) -> list:
        (tmp / name).write_bytes(data)
        return [tmp / name]

    return build


def _truncated(name: str, fmt: str | None = None):
    """A shared photo (re-encoded as ``fmt``) cut to half its bytes."""

    def build(tmp: Path, s: Shared) -> list:
        whole = tmp / f"whole{Path(name).suffix}"
        if fmt is None:
            shutil.copy(_photo(s), whole)
        else:
            Image.open(_photo(s)).save(whole, fmt)
        data = whole.read_bytes()
        (tmp / name).write_bytes(data[: len(data) // 2])
        return [tmp / name]

    return build


def _image(name: str, array: np.ndarray):
    def build(tmp: Path, s: Shared) -> list:
        Image.fromarray(array).save(tmp / name)
        return [tmp / name]

    return build


def _nifti(name: str, array: np.ndarray):
    def build(tmp: Path, s: Shared) -> list:
        nib.save(nib.Nifti1Image(array, np.eye(4)), tmp / name)
        return [tmp / name]

    return build


def _with_nonfinite(value: float) -> np.ndarray:
    volume = np.full((8, 8, 8), 40.0, np.float32)
    volume[2, 3, 4] = value
    return volume


def _dicom(name: str, test_file: str):
    def build(tmp: Path, s: Shared) -> list:
        shutil.copy(pydicom.data.get_testdata_file(test_file), tmp / name)
        return [tmp / name]

    return build


def _two_series(tmp: Path, s: Shared) -> list:
    folder = tmp / "mixed_series"
    folder.mkdir()
    for i in range(2):
        ds = pydicom.dcmread(pydicom.data.get_testdata_file("CT_small.dcm"))
        ds.SeriesInstanceUID = f"1.2.3.{i}"
        ds.save_as(folder / f"slice{i}.dcm")
    return [folder]


def _series_with_mr(tmp: Path, s: Shared) -> list:
    folder = tmp / "series_mr"
    folder.mkdir()
    shutil.copy(pydicom.data.get_testdata_file("MR_small.dcm"), folder / "slice1.dcm")
    return [folder]


def _empty_folder(name: str):
    def build(tmp: Path, s: Shared) -> list:
        (tmp / name).mkdir()
        return [tmp / name]

    return build


def _unreadable(tmp: Path, s: Shared) -> list:
    if ROOT:
        pytest.skip("root can read a chmod 000 file")
    copy = tmp / "locked.jpg"
    shutil.copy(_photo(s), copy)
    copy.chmod(0)
    return [copy]


def _dangling_link(tmp: Path, s: Shared) -> list:
    (tmp / "dangling.jpg").symlink_to(tmp / "gone.jpg")
    return [tmp / "dangling.jpg"]


def _twice(tmp: Path, s: Shared) -> list:
    return [_photo(s), _photo(s)]


def _two_spellings(tmp: Path, s: Shared) -> list:
    photo = _photo(s)
    return [photo, photo.parent / ".." / photo.parent.name / photo.name]


def _bad_among_good(tmp: Path, s: Shared) -> list:
    return [_photo(s, 0), tmp / "missing.jpg", _photo(s, 1)]


NON_UTF8 = os.fsdecode(b"scan\xff.jpg")


def _non_utf8_name(tmp: Path, s: Shared) -> list:
    shutil.copy(_photo(s), tmp / NON_UTF8)
    return [tmp / NON_UTF8]


def _fifo(tmp: Path, s: Shared) -> list:
    os.mkfifo(tmp / "x.jpg")
    return [tmp / "x.jpg"]


def _device_link(tmp: Path, s: Shared) -> list:
    (tmp / "zero.png").symlink_to("/dev/zero")
    return [tmp / "zero.png"]


def _system_file(tmp: Path, s: Shared) -> list:
    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("no /proc file system here")
    return [status]


def _audit(kind: str):
    """A run whose audit.sqlite is garbage, a folder, or read-only; routes one good photo."""

    def make(tmp: Path, s: Shared) -> list:
        run = s.copy_run(tmp)
        log = run / "audit.sqlite"
        if kind == "garbage":
            log.write_bytes(b"these are not the bytes of a SQLite database\n" * 40)
        elif kind == "folder":
            log.mkdir()
        else:
            if ROOT:
                pytest.skip("root writes read-only files")
            AuditLog(run).check()  # an empty log, then read-only with its folder
            log.chmod(0o444)
            run.chmod(0o555)
        return ["route", run, _photo(s)]

    return make


def _garbage_audit_skipped(tmp: Path, s: Shared) -> list:
    argv = _audit("garbage")(tmp, s)
    return [*argv, "--no-audit"]


def _no_run(tmp: Path, s: Shared) -> list:
    return ["route", tmp / "no_such_run", _photo(s)]


def _unknown_router(tmp: Path, s: Shared) -> list:
    return ["route", s.copy_run(tmp), _photo(s), "--router", "nearest"]


CASES = [
    Case("a scan file that does not exist",
         _route(lambda tmp, s: [tmp / "missing.jpg"]), 1, ("missing.jpg", "no such file")),
    Case("a symlink whose target is gone", _route(_dangling_link), 1,
         ("dangling.jpg", "no such file")),
    Case("a folder with no scans", _route(_empty_folder("no_scans")), 1,
         ("no_scans", "is a folder", "no DICOM files")),
    Case("a folder named like a photo", _route(_empty_folder("folder.jpg")), 1,
         ("folder.jpg", "is a folder")),
    Case("a site folder of photos passed as one scan",
         _route(lambda tmp, s: [s.data / "ACRIMA"]), 1,
         ("ACRIMA", "is a folder", "pass scan files themselves")),
    Case("an empty file named .png", _route(_write("empty.png", b"")), 1,
         ("empty.png", "empty (0 bytes)")),
    Case("an empty file named .nii.gz", _route(_write("empty.nii.gz", b"")), 1,
         ("empty.nii.gz", "empty (0 bytes)")),
    Case("a text file named .png", _route(_write("notes.png", b"clinic notes\n" * 20)), 1,
         ("notes.png", "not a readable image")),
    Case("a truncated JPEG", _route(_truncated("cut.jpg")), 1, ("cut.jpg", "truncated")),
    Case("a truncated PNG", _route(_truncated("cut.png", "PNG")), 1, ("cut.png", "truncated")),
    Case("a photo this user may not read", _route(_unreadable), 1,
         ("locked.jpg", "permission denied")),
    Case("an all-black photo", _route(_image("black.png", np.zeros((64, 64, 3), np.uint8))), 1,
         ("black.png", "no camera field found")),
    Case("a float TIFF with NaN pixels",
         _route(_image("nan.tif", np.full((32, 32), np.nan, np.float32))), 1,
         ("nan.tif", "float")),
    Case("a NIfTI volume with NaN voxels", _route(_nifti("nan.nii.gz", _with_nonfinite(np.nan))),
         1, ("nan.nii.gz", "NaN")),
    Case("a NIfTI volume with infinite voxels",
         _route(_nifti("inf.nii.gz", _with_nonfinite(np.inf))), 1, ("inf.nii.gz", "infinite")),
    Case("a 4-D NIfTI volume",
         _route(_nifti("four.nii.gz", np.zeros((8, 8, 8, 3), np.float32))), 1,
         ("four.nii.gz", "3-D")),
    Case("a damaged NIfTI file", _route(_write("broken.nii.gz", b"\x1f\x8b" + b"\0" * 64)), 1,
         ("broken.nii.gz", "NIfTI")),
    Case("an MR DICOM file", _route(_dicom("mr.dcm", "MR_small.dcm")), 1,
         ("mr.dcm", "modality is 'MR'", "not CT")),
    Case("a DICOM series folder holding an MR slice", _route(_series_with_mr), 1,
         ("slice1.dcm", "not CT")),
    Case("a folder mixing two DICOM series", _route(_two_series), 1,
         ("mixed_series", "2 DICOM series")),
    Case("a .dcm file that is not DICOM", _route(_write("fake.dcm", b"not dicom" * 30)), 1,
         ("fake.dcm", "DICM")),
    Case("a NumPy array file", _route(_write("scan.npy", b"\x93NUMPY" + b"\0" * 100)), 1,
         ("scan.npy", "unsupported file type", "NIfTI")),
    Case("a CT slice sent to a fundus federation", _route(_dicom("ct.dcm", "CT_small.dcm")), 0,
         ("ct.dcm", "abstain", "trained on fundus")),
    Case("a photo given twice", _route(_twice), 0, ("given 2 times", "answered once")),
    Case("one photo under two spellings", _route(_two_spellings), 0,
         ("given 2 times", "answered once")),
    Case("one bad file among good ones", _route(_bad_among_good), 1,
         ("missing.jpg", "no such file", "Im001", "Im002")),
    Case("a file name that is not UTF-8", _route(_non_utf8_name), 0, ("scan\\xff.jpg",)),
    Case("an audit log that is not a SQLite database", _audit("garbage"), 2,
         ("audit.sqlite", "not a SQLite database", "--no-audit")),
    Case("an audit log that is a folder", _audit("folder"), 2,
         ("audit.sqlite", "cannot be recorded", "--no-audit")),
    Case("a read-only audit log", _audit("read-only"), 2,
         ("audit.sqlite", "cannot be recorded", "writable", "--no-audit")),
    Case("a damaged audit log with --no-audit", _garbage_audit_skipped, 0, ("Im001",)),
    Case("a FIFO named like a photo", _route(_fifo), 1,
         ("x.jpg", "not a regular file (a FIFO)")),
    Case("a link to /dev/zero named like a photo", _route(_device_link), 1,
         ("zero.png", "not a regular file (a character device)")),
    Case("an empty scan path", _route(lambda tmp, s: [""]), 2, ("empty scan path ('')",)),
    Case("a system file whose size reads 0 bytes", _route(_system_file), 1,
         ("/proc/self/status", "not a scan file")),
    Case("an unknown router", _unknown_router, 2, ("unknown router", "nearest")),
    Case("a run directory that does not exist", _no_run, 2, ("no_such_run",)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_route_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)


def _strict(text: str):
    """json.loads that refuses NaN and Infinity (which json.dumps writes by default)."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_route_json_is_strict_json_with_one_object_per_file(tmp_path, shared: Shared) -> None:
    run = shared.copy_run(tmp_path)
    (tmp_path / "empty.png").write_bytes(b"")
    files = [_photo(shared), tmp_path / "empty.png", _photo(shared)]
    result = CliRunner().invoke(app, ["route", str(run), *map(str, files), "--json"])
    assert result.exit_code == 1, result.output
    rows = _strict(result.stdout)
    assert [Path(r["file"]).name for r in rows] == [files[0].name, "empty.png"]
    fields = {"time", "file", "sha256", "router", "status", "chosen_site", "site_probs",
              "prediction", "prediction_prob", "ood_score", "reason", "class_probs",
              "decision_rule", "audit_id", "model"}  # fmt: skip
    assert all(set(r) - {"nearest"} == fields for r in rows)
    assert rows[0]["model"] == rows[1]["model"] == RunDir(run).model_id()  # named, even an error
    assert rows[0]["status"] in {"routed", "abstained"} and rows[1]["status"] == "error"
    assert "given 2 times" in result.stderr  # the warning stays out of the JSON


_REAL_OUTPUTS = TrainedFederation.outputs


def _nan_outputs(fed: TrainedFederation, views) -> SiteOutputs:
    """Every site's outputs for ``views``, with NaN class probabilities and client logits."""
    out = _REAL_OUTPUTS(fed, views)
    return SiteOutputs(
        np.full_like(out.class_probs, np.nan),
        None if out.client_logits is None else np.full_like(out.client_logits, np.nan),
        out.features,
    )


@pytest.fixture(scope="module")
def fed(shared: Shared) -> TrainedFederation:
    return TrainedFederation.load(shared.run, "cpu")


def test_nan_model_outputs_are_never_reported_as_routed(fed, shared, monkeypatch) -> None:
    monkeypatch.setattr(fed, "outputs", lambda views: _nan_outputs(fed, views))
    for router in (DensityRatioRouter(), MajorityVoteRouter()):
        entry = route_one(fed, router, _photo(shared))
        assert entry.status == "error", entry
        assert _photo(shared).name in entry.reason and "NaN" in entry.reason
        assert entry.chosen_site is None and entry.prediction is None
        assert entry.site_probs == {} and entry.prediction_prob is None


def test_nan_out_of_distribution_score_is_never_reported_as_routed(
    fed, shared, monkeypatch
) -> None:
    assert fed.abstention is not None
    monkeypatch.setattr(fed.abstention, "scores", lambda features: np.full(1, np.nan))
    views = service.views_for(fed, read_scan(_photo(shared)))
    assert bool(DensityRatioRouter().route(fed, views).abstained[0])  # the router never routes it
    entry = route_one(fed, DensityRatioRouter(), _photo(shared))
    assert entry.status == "error" and "out-of-distribution score is nan" in entry.reason
    assert entry.chosen_site is None


def test_nan_preprocessed_values_are_never_routed(fed, shared, monkeypatch) -> None:
    real = service.views_for
    monkeypatch.setattr(
        service, "views_for", lambda f, scan: [v * float("nan") for v in real(f, scan)]
    )
    entry = route_one(fed, DensityRatioRouter(), _photo(shared))
    assert entry.status == "error" and "preprocessed values are NaN" in entry.reason


def test_route_cli_with_nan_outputs_prints_strict_json_and_exits_1(
    tmp_path, shared, monkeypatch
) -> None:
    run = shared.copy_run(tmp_path)
    monkeypatch.setattr(TrainedFederation, "outputs", _nan_outputs)
    result = CliRunner().invoke(app, ["route", str(run), str(_photo(shared)), "--json"])
    assert result.exit_code == 1, result.output
    (row,) = _strict(result.stdout)
    assert row["status"] == "error" and "NaN" in row["reason"]
    (logged,) = AuditLog(run).read()
    assert logged.status == "error" and logged.prediction is None


def test_a_file_name_that_is_not_utf8_is_logged_escaped(tmp_path, shared: Shared) -> None:
    run = shared.copy_run(tmp_path)
    photo = tmp_path / NON_UTF8
    shutil.copy(_photo(shared), photo)
    result = CliRunner().invoke(app, ["route", str(run), str(photo), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = _strict(result.stdout)
    (logged,) = AuditLog(run).read()
    assert logged.file == row["file"] == str(tmp_path / "scan\\xff.jpg")
    assert logged.status in {"routed", "abstained"}


def test_permission_is_named_not_called_corrupt(tmp_path, shared, monkeypatch) -> None:
    # Root reads any file, so the denial is simulated for this one file.
    photo = tmp_path / "locked.jpg"
    shutil.copy(_photo(shared), photo)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, *a, **kw: p != photo and real_access(p, *a, **kw))
    with pytest.raises(MedfedError, match="permission denied") as info:
        read_scan(photo)
    assert "corrupt" not in str(info.value) and str(photo) in str(info.value)


def test_a_garbage_audit_log_is_named_when_read(tmp_path) -> None:
    (tmp_path / "audit.sqlite").write_bytes(b"garbage" * 100)
    with pytest.raises(MedfedError, match="not a SQLite database") as info:
        AuditLog(tmp_path).read()
    assert str(tmp_path / "audit.sqlite") in str(info.value)


def test_a_read_only_audit_log_is_refused_before_routing(tmp_path, shared, monkeypatch) -> None:
    # Root writes read-only files, so the log is opened read-only the way SQLite does it for a
    # file without write permission.
    run = shared.copy_run(tmp_path)
    AuditLog(run).check()  # creates the empty log

    def read_only(self):
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        db.execute(audit._SCHEMA)
        return db

    monkeypatch.setattr(AuditLog, "_connect", read_only)
    routed: list[Path] = []
    monkeypatch.setattr(service, "route_one", lambda *a, **kw: routed.append(a[2]))
    result = CliRunner().invoke(app, ["route", str(run), str(_photo(shared))])
    assert result.exit_code == 2 and routed == []  # refused before any scan was routed
    assert str(run / "audit.sqlite") in result.output and "--no-audit" in result.output
    assert "readonly database" in result.output


def test_routing_many_files_shows_a_bar_over_them(tmp_path, shared, monkeypatch) -> None:
    seen: list[tuple[int, bool]] = []

    def spy(items, desc, *, show=True, **kw):
        items = list(items)
        seen.append((len(items), show))
        return iter(items)

    monkeypatch.setattr(service, "bar", spy)
    run = shared.copy_run(tmp_path)
    photos = [str(_photo(shared, i)) for i in range(3)]
    assert CliRunner().invoke(app, ["route", str(run), *photos]).exit_code == 0
    assert CliRunner().invoke(app, ["route", str(run), *photos, "--no-progress"]).exit_code == 0
    assert seen == [(3, True), (3, False)]


def test_route_help_says_what_json_prints_and_shows_defaults() -> None:
    result = CliRunner().invoke(app, ["route", "--help"], terminal_width=200)
    text = " ".join(result.output.replace("│", " ").split())
    assert "a list with one object per file" in text
    for field in ("sha256", "status (routed, abstained or error)", "site_probs", "ood_score"):
        assert field in text
    assert "[default: auto]" in text and "[default: audit]" in text
    assert "[default: progress]" in text
