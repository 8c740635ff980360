"""Synthetic studies as a PACS holds them, and a real Orthanc on loopback to hold them.

``fundus_photo(png, ...)``: one Ophthalmic Photography instance (or Secondary Capture) whose
pixels are a synthetic site's photo; ``ct_series(folder, ...)``: a small CT series.
``orthanc(tmp)``: Orthanc with its DICOMweb plugin on free loopback ports, killed by PID
(``users``: HTTP Basic accounts it requires). ``tls_proxy(port, ...)``: HTTPS on loopback in
front of it, as a hospital's reverse proxy would be (Orthanc 1.10's own HTTPS, ``SslEnabled``,
resets every request in the Debian build, so the TLS tests go through the proxy).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid

from tests import realfiles

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
    """The photo at ``png`` as a one-instance study (``modality`` OP, or XC/OT for SC), made
    as 'medfed pacs make-study' makes it."""
    from medfed.clinic.pacs.make_study import StudyIds, photo_instance
    from medfed.data.io import read_image

    ids = StudyIds(patient, accession=patient[-8:], study_date="20261201")
    return photo_instance(read_image(png), ids, modality=modality)


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
    auth: tuple[str, str] | None = None  # an account of RegisteredUsers, when required

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    @property
    def dicomweb(self) -> str:
        return f"{self.url}/dicom-web"

    def session(self):  # a requests.Session signed in and trusting the server's certificate
        import requests

        session = requests.Session()
        session.trust_env = False
        session.auth = self.auth
        return session

    def get(self, path: str) -> object:
        answer = self.session().get(self.url + path, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def store(self, datasets: list[Dataset]) -> None:
        from dicomweb_client.api import DICOMwebClient

        DICOMwebClient(self.dicomweb, session=self.session()).store_instances(datasets)

    def reports(self, study: str) -> int:
        """How many SR series (medfed's answers) the study holds."""
        from dicomweb_client.api import DICOMwebClient

        client = DICOMwebClient(self.dicomweb, session=self.session())
        return len(client.search_for_series(study, search_filters={"Modality": "SR"}))


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA: (certificate, key) PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "medfed test PACS")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    (folder / "ca.pem").write_bytes(pem)
    (folder / "key.pem").write_bytes(private)
    (folder / "key.pem").chmod(0o600)
    return folder / "ca.pem", folder / "key.pem"


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def tls_proxy(target: int, cert: Path, key: Path) -> Iterator[int]:
    """HTTPS on a free loopback port, passed on to http://127.0.0.1:``target``; its port."""
    import ssl
    import threading

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_relay, args=(raw,), daemon=True).start()

    def _relay(raw: socket.socket) -> None:
        raw.settimeout(30)
        try:
            client = context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):  # a client that does not trust the certificate
            raw.close()
            return
        with client, socket.create_connection(("127.0.0.1", target), timeout=30) as upstream:
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join(timeout=30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


@contextlib.contextmanager
def orthanc(tmp: Path, *, users: dict[str, str] | None = None) -> Iterator[Orthanc]:
    """A fresh Orthanc with DICOMweb on loopback, storage under ``tmp``; killed on exit.
    ``users``: it requires HTTP Basic with one of these accounts."""
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
        "AuthenticationEnabled": bool(users),
        "RegisteredUsers": users or {},
        "Plugins": [str(DICOMWEB_PLUGIN)],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
    }
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "orthanc.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    log = (tmp / "orthanc.log").open("w")
    process = subprocess.Popen([str(ORTHANC), str(path)], stdout=log, stderr=subprocess.STDOUT)
    account = next(iter(users.items())) if users else None
    server = Orthanc(http, dicom, process, account)
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


def audit_rows(run: Path) -> list[tuple]:
    """(id, file, status) of every row of a run's audit log, in order ([] without a log)."""
    path = run / "audit.sqlite"
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return db.execute("SELECT id, file, status FROM routed ORDER BY id").fetchall()


def assert_private(run: Path) -> int:
    """Every file holding patient data in ``run`` (the audit and PACS logs with their side
    files, kept scans, answers, incoming instances) is 0600 and every folder of them 0700;
    returns how many files were checked."""
    checked = 0
    paths = [p for p in run.iterdir() if p.name.startswith(("audit.sqlite", "pacs.sqlite"))]
    for folder in (run / "review", run / "pacs"):
        if folder.exists():
            paths += [folder, *folder.rglob("*")]
    for path in paths:
        mode = path.stat().st_mode & 0o777
        wanted = 0o700 if path.is_dir() else 0o600
        assert mode == wanted, f"{path} is {oct(mode)}, not {oct(wanted)}"
        checked += path.is_file()
    return checked
