"""Synthetic studies as a PACS holds them, and a real Orthanc on loopback to hold them.

``fundus_photo(png, ...)``: one Ophthalmic Photography instance (or Secondary Capture) whose
pixels are a synthetic site's photo; ``ct_series(folder, ...)``: a small CT series.
``orthanc(tmp)``: Orthanc with its DICOMweb plugin on free loopback ports, killed by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from tests import realfiles

OP_STORAGE = "1.2.840.10008.5.1.4.1.1.77.1.5.1"  # Ophthalmic Photography 8 Bit Image Storage
SC_STORAGE = "1.2.840.10008.5.1.4.1.1.7"  # Secondary Capture Image Storage
DICOMWEB_PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
ORTHANC = Path(shutil.which("Orthanc") or "/usr/sbin/Orthanc")  # /usr/sbin: off some PATHs


def require_orthanc() -> None:
    """Skip (fail under CI, whose .ci/run installs Orthanc) when Orthanc cannot be started."""
    missing = [
        f"{path} (Debian package {package})"
        for path, package in ((ORTHANC, "orthanc"), (DICOMWEB_PLUGIN, "orthanc-dicomweb"))
        if not path.exists()
    ]
    if missing:
        message = "the PACS test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run installs them before the tests")
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _patient(ds: Dataset, patient: str, study: str) -> None:
    ds.PatientName = f"Test^{patient}"
    ds.PatientID = patient
    ds.PatientBirthDate = "19600101"
    ds.PatientSex = "O"
    ds.StudyInstanceUID = study
    ds.StudyDate = "20261201"
    ds.StudyTime = "101500"
    ds.AccessionNumber = patient[-8:]
    ds.StudyID = "1"
    ds.ReferringPhysicianName = ""


def fundus_photo(png: Path, patient: str, *, modality: str = "OP") -> Dataset:
    """The photo at ``png`` as a one-instance study (``modality`` OP, or XC/OT for SC)."""
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=np.uint8)
    sop_class = OP_STORAGE if modality == "OP" else SC_STORAGE
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.preamble = b"\0" * 128  # a Part 10 file as STOW-RS sends it (dicomweb-client keeps it)
    _patient(ds, patient, generate_uid())
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.SeriesInstanceUID = generate_uid()
    ds.Modality = modality
    ds.SeriesNumber = 1
    ds.InstanceNumber = 1
    ds.Rows, ds.Columns = pixels.shape[:2]
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = "RGB"
    ds.PlanarConfiguration = 0
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.PixelData = pixels.tobytes()
    return ds


def ct_series(folder: Path, patient: str, n: int = 4) -> list[Dataset]:
    """A CT study of one series of ``n`` 8x8 slices."""
    import pydicom

    study, series = generate_uid(), _short_uid()  # write_ct_slice appends ".0" to the series
    out = []
    for k in range(n):
        pixels = np.full((8, 8), 40 + 10 * k, dtype=np.int16)
        path = realfiles.write_ct_slice(
            folder / f"{patient}_{k}.dcm", pixels, position=(0.0, 0.0, 2.5 * k),
            patient_id=patient, series_uid=series,
        )  # fmt: skip
        ds = pydicom.dcmread(path)
        _patient(ds, patient, study)
        ds.SeriesNumber = 2
        ds.InstanceNumber = k + 1
        out.append(ds)
    return out


def _short_uid() -> str:
    return f"2.25.{uuid.uuid4().int % 10**30}"


@dataclass
class Orthanc:
    http: int
    dicom: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    @property
    def dicomweb(self) -> str:
        return f"{self.url}/dicom-web"

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return json.loads(answer.read())

    def store(self, datasets: list[Dataset]) -> None:
        from dicomweb_client.api import DICOMwebClient

        DICOMwebClient(self.dicomweb).store_instances(datasets)


@contextlib.contextmanager
def orthanc(tmp: Path) -> Iterator[Orthanc]:
    """A fresh Orthanc with DICOMweb on loopback, storage under ``tmp``; killed on exit."""
    require_orthanc()
    http, dicom = free_port(), free_port()
    config = {
        "Name": "medfed-test",
        "StorageDirectory": str(tmp / "storage"),
        "IndexDirectory": str(tmp / "storage"),
        "HttpPort": http,
        "DicomPort": dicom,
        "DicomServerEnabled": False,
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": False,
        "Plugins": [str(DICOMWEB_PLUGIN)],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
    }
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "orthanc.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    log = (tmp / "orthanc.log").open("w")
    process = subprocess.Popen([str(ORTHANC), str(path)], stdout=log, stderr=subprocess.STDOUT)
    server = Orthanc(http, dicom, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                server.get("/system")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp / "orthanc.log").read_text()) from None
                time.sleep(0.1)
        yield server
    finally:
        process.kill()
        process.wait(timeout=10)
        log.close()
