"""``medfed serve``'s pixel limit: every oversized image (PNG, JPEG, DICOM), whatever size its
header claims and whatever its name says, is refused 413 from its header, before anything is
decoded and before any audit row."""

from __future__ import annotations

import io
import struct
import zlib

import pytest

from tests.badinput import Shared

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from medfed.clinic.pacs.headers import OVER_DECODER, image_size  # noqa: E402
from tests.pacs_studies import audit_rows  # noqa: E402


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height``, with one tiny (wrong) IDAT."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_header(width: int, height: int) -> bytes:
    """A JPEG whose frame header (SOF0) claims ``width`` x ``height``, after an APP0 segment."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def dicom_header(rows: int, columns: int) -> bytes:
    """A DICOM file whose Rows and Columns claim ``rows`` x ``columns`` (no pixel data)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.77.1.5.1"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.Rows, ds.Columns = "OP", rows, columns
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def served(shared: Shared, tmp_path_factory):
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import Served, create_app
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path_factory.mktemp("limits"))
    fed = TrainedFederation.load(run, "cpu")
    runs = {"run": Served("run", run, fed, make_router("auto", fed))}
    client = TestClient(create_app(runs, Limits(), token=None))  # the default 100 megapixels
    return client, run


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("giga.png", lambda: png_header(60_000, 60_000)),  # 3.6 gigapixels: over PIL's own guard
        ("big.png", lambda: png_header(15_000, 10_000)),  # 150 megapixels: under PIL's guard
        ("giga.jpg", lambda: jpeg_header(60_000, 60_000)),
        ("big.jpg", lambda: jpeg_header(15_000, 10_000)),
        ("giga.dcm", lambda: dicom_header(60_000, 60_000)),
        ("big.dcm", lambda: dicom_header(15_000, 10_000)),
        ("no-suffix", lambda: png_header(60_000, 60_000)),  # the bytes say PNG, the name nothing
        ("renamed.tif", lambda: jpeg_header(15_000, 10_000)),
    ],
)
def test_every_oversized_image_is_refused_413_from_its_header_and_never_logged(
    served, name, make
) -> None:
    client, run = served
    before = audit_rows(run)

    answer = client.post("/route", params={"name": name}, content=make())

    assert answer.status_code == 413, answer.text
    assert "over the limit of 100000000" in answer.json()["detail"]
    assert "--max-pixels" in answer.json()["detail"]
    assert audit_rows(run) == before


def test_an_image_within_the_limit_is_still_answered(served, shared: Shared) -> None:
    client, run = served
    photo = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    answer = client.post("/route", params={"name": photo.name}, content=photo.read_bytes())
    assert answer.status_code == 200, answer.text
    assert answer.json()["audit_id"] == audit_rows(run)[-1][0]


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png_header(60_000, 60_000), (60_000, 60_000)),
        (jpeg_header(640, 480), (640, 480)),
        (b"\x89PNG\r\n\x1a\n", None),  # cut short
        (b"\xff\xd8\xff\xda\x00\x02", None),  # a scan before any frame header
        (b"\xff\xd8" + b"\xff\xe0\x00\x01", None),  # a length below 2
        (b"not an image", None),
    ],
)
def test_image_size_reads_the_header_only(tmp_path, data: bytes, size) -> None:
    path = tmp_path / "scan"
    path.write_bytes(data)
    assert image_size(path) == size


def test_a_format_the_decoder_refuses_as_a_bomb_is_over_any_limit(tmp_path) -> None:
    header = b"BM" + struct.pack("<IHHI", 0, 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, 60_000, 60_000, 1, 24, 0, 0, 0, 0, 0, 0)
    path = tmp_path / "giga.bmp"
    path.write_bytes(header + info)
    assert image_size(path) == (OVER_DECODER, 1)
