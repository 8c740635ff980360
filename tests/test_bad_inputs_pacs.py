"""The bad-input corpus, `medfed pacs watch`, `pacs backfill`, `pacs listen`, `serve` and
`ops units` cases (see tests/badinput.py for the policy). Every option is refused before the run
is loaded or any PACS is asked; the one PACS these rows reach is a closed loopback port."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.badinput import Case, Shared, check
from tests.pacs_studies import free_port

pytest.importorskip("dicomweb_client")

URL = "http://127.0.0.1:8042/dicom-web"


def _watch(*options: str, url: str = URL, command: str = "watch"):
    def make(tmp: Path, s: Shared) -> list:
        return ["pacs", command, s.run, "--dicomweb", url, "--device", "cpu", *options]

    return make


def _secret(name: str, text: str | bytes, mode: int = 0o600, option: str = "--basic-auth-file"):
    """``watch`` with ``option`` naming a file holding ``text`` with ``mode``."""

    def make(tmp: Path, s: Shared) -> list:
        path = tmp / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        path.chmod(mode)
        return ["pacs", "watch", s.run, "--dicomweb", URL, option, path]

    return make


def _file(option: str, text: str | None, url: str = "https://pacs.example.org/dicom-web"):
    """``watch`` with ``option`` naming a file holding ``text`` (None: no such file)."""

    def make(tmp: Path, s: Shared) -> list:
        path = tmp / "given.pem"
        if text is not None:
            path.write_text(text, encoding="utf-8")
        return ["pacs", "watch", s.run, "--dicomweb", url, option, path]

    return make


def _unreachable(command: str):
    def make(tmp: Path, s: Shared) -> list:
        url = f"http://127.0.0.1:{free_port()}/dicom-web"
        argv = ["pacs", command, s.copy_run(tmp), "--dicomweb", url, "--device", "cpu"]
        return argv + (["--polls", "1"] if command == "watch" else [])

    return make


def _listen(*options: str):
    def make(tmp: Path, s: Shared) -> list:
        return ["pacs", "listen", s.run, "--allow", "CAMERA", *options]

    return make


def _make_study(*options: str, photo: str | None = "eye.png"):
    """``pacs make-study`` of one small photo (or of ``photo`` as given) into tmp/study."""

    def make(tmp: Path, s: Shared) -> list:
        inputs = []
        if photo == "eye.png":
            from PIL import Image

            Image.new("RGB", (8, 8), (90, 20, 10)).save(tmp / "eye.png")
        elif photo is not None and photo.endswith(".txt"):
            (tmp / photo).write_text("not a photo", encoding="utf-8")
        if photo is not None:
            inputs.append(tmp / photo)
        return ["pacs", "make-study", *inputs, "--out", tmp / "study", *options]

    return make


def _promote(into_itself: bool = False, damage: bool = False):
    """``ops promote`` of a copy of the shared run into another copy (the same model), into
    itself, or of a copy whose first weight file was changed (``damage``)."""

    def make(tmp: Path, s: Shared) -> list:
        live = s.copy_run(tmp / "live")
        if into_itself:
            return ["ops", "promote", live, live]
        new = s.copy_run(tmp / "new")
        if damage:
            with open(sorted((new / "model").glob("site_*.safetensors"))[0], "ab") as handle:
                handle.write(b"\0")
        return ["ops", "promote", live, new]

    return make


def _history_edited(tmp: Path, s: Shared) -> list:
    live = s.copy_run(tmp)
    (live / "releases").mkdir()
    (live / "releases" / "history.jsonl").write_text("{not json\n", encoding="utf-8")
    return ["ops", "releases", live]


def _units(*options: str, run: str = "runs/feddrm"):
    """``ops units`` of a run directory at ``run`` under the test's folder."""

    def make(tmp: Path, s: Shared) -> list:
        folder = tmp / run
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text("[train]\n", encoding="utf-8")
        return ["ops", "units", "--run", folder, "--out", tmp / "units", *options]

    return make


def _folder(command: str, option: str, url: str = URL):
    """``command`` with ``option`` naming a folder where a file belongs."""

    def make(tmp: Path, s: Shared) -> list:
        folder = tmp / "a-folder"
        folder.mkdir()
        if command == "serve":
            return ["serve", s.run, option, folder]
        return ["pacs", "watch", s.run, "--dicomweb", url, option, folder]

    return make


def _self_signed(tmp: Path) -> Path:
    """A real PEM certificate (and no key beside it), for rows about the key."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    path = tmp / "server.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _tls(command: str, good_cert: bool):
    """``command`` with a garbage --tls-key, and a garbage or a real --tls-cert."""

    def make(tmp: Path, s: Shared) -> list:
        key = tmp / "garbage.key"
        key.write_text("not a key at all\n", encoding="utf-8")
        if good_cert:
            cert = _self_signed(tmp)
        else:
            cert = tmp / "garbage.crt"
            cert.write_text("not a certificate\n", encoding="utf-8")
        head = ["serve", s.run] if command == "serve" else ["pacs", "listen", s.run, "--allow", "X"]
        return [*head, "--tls-cert", cert, "--tls-key", key]

    return make


def _serve_damaged_audit(tmp: Path, s: Shared) -> list:
    run = s.copy_run(tmp)
    (run / "audit.sqlite").write_bytes(b"this is no database" * 100)
    return ["serve", run]


def _units_into_a_file(tmp: Path, s: Shared) -> list:
    (tmp / "units").write_text("a file\n", encoding="utf-8")
    return _units()(tmp, s)


AUTH = "MEDFED_PACS_USER"
CASES = [
    Case("pacs watch --polls is negative", _watch("--polls", "-1"), 2, ("--polls", "-1")),
    Case("pacs watch --polls is 0", _watch("--polls", "0"), 2, ("--polls",)),
    Case("pacs watch --polls is not a number", _watch("--polls", "many"), 2, ("--polls",)),
    Case("pacs watch --interval is negative", _watch("--interval", "-5"), 2,
         ("--interval", "-5.0", "seconds")),
    Case("pacs watch --interval is nan", _watch("--interval", "nan"), 2,
         ("--interval", "nan", "seconds")),
    Case("pacs watch --interval is inf", _watch("--interval", "inf"), 2, ("--interval", "inf")),
    Case("pacs watch --max-failures is negative", _watch("--max-failures", "-2"), 2,
         ("--max-failures",)),
    Case("pacs watch --find is unknown", _watch("--find", "date"), 2,
         ("--find", "auto, changes, sweep")),
    Case("pacs watch --orthanc with --find sweep",
         _watch("--find", "sweep", "--orthanc", "http://127.0.0.1:8042"), 2,
         ("--orthanc", "sweep")),
    Case("pacs watch --orthanc is plain http off loopback",
         _watch("--orthanc", "http://pacs.example.org"), 2, ("--orthanc", "https")),
    Case("pacs watch --dicomweb port above 65535",
         _watch(url="http://127.0.0.1:70000/dicom-web"), 2, ("--dicomweb", "port", "65535")),
    Case("pacs watch --dicomweb port 0", _watch(url="http://127.0.0.1:0/dicom-web"), 2,
         ("--dicomweb", "port 0")),
    Case("pacs watch --dicomweb is no URL", _watch(url="pacs.example.org"), 2,
         ("--dicomweb", "not an http(s) URL")),
    Case("pacs watch --dicomweb holds a password",
         _watch(url="https://medfed:secret@pacs.example.org/dicom-web"), 2,
         ("--dicomweb", "--basic-auth-file")),
    Case("pacs backfill --dicomweb port above 65535",
         _watch(url="http://127.0.0.1:99999/dicom-web", command="backfill"), 2,
         ("--dicomweb", "65535")),
    Case("pacs watch --basic-auth-file is missing",
         lambda tmp, s: ["pacs", "watch", s.run, "--dicomweb", URL, "--basic-auth-file",
                         tmp / "nothing.auth"], 2, ("--basic-auth-file", "no such file")),
    Case("pacs watch --basic-auth-file others may read", _secret("a.auth", "u:p\n", 0o644), 2,
         ("--basic-auth-file", "chmod 600")),
    Case("pacs watch --basic-auth-file has no colon", _secret("a.auth", "medfed\n"), 2,
         ("--basic-auth-file", "USER:PASSWORD")),
    Case("pacs watch --basic-auth-file has no password", _secret("a.auth", "medfed:\n"), 2,
         ("--basic-auth-file", "password is empty")),
    Case("pacs watch --basic-auth-file has no user", _secret("a.auth", ":secret\n"), 2,
         ("--basic-auth-file", "user name is empty")),
    Case("pacs watch --basic-auth-file is empty", _secret("a.auth", "\n"), 2,
         ("--basic-auth-file", "empty")),
    Case("pacs watch --basic-auth-file is binary", _secret("a.auth", b"\xff\xfe:\x00"), 2,
         ("--basic-auth-file",)),
    Case("pacs watch --token-file others may read",
         _secret("t.token", "abc\n", 0o640, "--token-file"), 2, ("--token-file", "chmod 600")),
    Case("pacs watch --token-file holds spaces",
         _secret("t.token", "two words\n", option="--token-file"), 2,
         ("--token-file", "spaces")),
    Case("pacs watch --token-file is a folder", _folder("watch", "--token-file"), 2,
         ("--token-file", "a-folder", "is a folder")),
    Case("pacs watch --basic-auth-file is a folder", _folder("watch", "--basic-auth-file"), 2,
         ("--basic-auth-file", "a-folder", "is a folder")),
    Case("pacs watch --ca-file is a folder",
         _folder("watch", "--ca-file", "https://pacs.example.org/dicom-web"), 2,
         ("--ca-file", "a-folder", "is a folder")),
    Case("serve --token-file is a folder", _folder("serve", "--token-file"), 2,
         ("a-folder", "is a folder", "token file")),
    Case("serve --tls-cert is no certificate", _tls("serve", False), 2,
         ("--tls-cert", "garbage.crt", "not a PEM certificate")),
    Case("serve --tls-key is no key", _tls("serve", True), 2,
         ("--tls-key", "garbage.key", "not a PEM private key")),
    Case("pacs listen --tls-cert is no certificate", _tls("listen", False), 2,
         ("--tls-cert", "garbage.crt", "not a PEM certificate")),
    Case("pacs listen --tls-key is no key", _tls("listen", True), 2,
         ("--tls-key", "garbage.key", "not a PEM private key")),
    Case("pacs watch --basic-auth-env without the variables", _watch("--basic-auth-env"), 2,
         ("--basic-auth-env", "MEDFED_PACS_PASSWORD")),
    Case("pacs watch --basic-auth-env without the password", _watch("--basic-auth-env"), 2,
         ("MEDFED_PACS_PASSWORD", "not set"), env=((AUTH, "medfed"),)),
    Case("pacs watch --basic-auth-env user holds a colon", _watch("--basic-auth-env"), 2,
         ("--basic-auth-env", "':'"), env=((AUTH, "a:b"), ("MEDFED_PACS_PASSWORD", "x"))),
    Case("pacs watch two ways to sign in",
         _watch("--basic-auth-env", "--token-file", "/nonexistent"), 2,
         ("--token-file", "--basic-auth-env", "give one")),
    Case("pacs watch --ca-file is missing", _file("--ca-file", None), 2,
         ("--ca-file", "no such file")),
    Case("pacs watch --ca-file is not PEM", _file("--ca-file", "not a certificate\n"), 2,
         ("--ca-file", "not a PEM file")),
    Case("pacs watch --ca-file with plain http", _file("--ca-file", "x\n", URL), 2,
         ("--ca-file", "not https")),
    Case("pacs watch cannot reach the PACS", _unreachable("watch"), 3,
         ("error:", "could not reach", "is the PACS up")),
    Case("pacs backfill cannot reach the PACS", _unreachable("backfill"), 3,
         ("error:", "searching studies", "is the PACS up")),
    Case("pacs watch --metrics-port above 65535", _watch("--metrics-port", "70000"), 2,
         ("--metrics-port", "70000")),
    Case("pacs watch --metrics-port is 0", _watch("--metrics-port", "0"), 2,
         ("--metrics-port", "0")),
    Case("pacs watch --metrics-port is not a number", _watch("--metrics-port", "http"), 2,
         ("--metrics-port", "http")),
    Case("pacs watch --metrics-host is no IP address",
         _watch("--metrics-port", "9100", "--metrics-host", "localhost:9100"), 2,
         ("--metrics-host", "localhost:9100", "not an IP address")),
    Case("serve --log-format is unknown", lambda tmp, s: ["serve", s.run, "--log-format", "xml"],
         2, ("--log-format", "'xml'", "text or json")),
    Case("serve on a damaged audit log", _serve_damaged_audit, 2,
         ("audit.sqlite", "damaged", "does not start", "Move the file aside")),
    Case("ops units --user root", _units("--user", "root"), 2, ("--user root", "unprivileged")),
    Case("ops units --user is no account name", _units("--user", "Med Fed"), 2,
         ("--user", "'Med Fed'", "not an account name")),
    Case("ops units --run is no run directory",
         lambda tmp, s: ["ops", "units", "--run", tmp, "--out", tmp / "units"], 2,
         ("--run", "not a run directory", "config.toml")),
    Case("ops units --run path holds a space", _units(run="my runs/feddrm"), 2,
         ("--run", "no spaces")),
    Case("ops units --out is a file", _units_into_a_file, 2, ("--out", "a file")),
    Case("ops units --serve-port above 65535", _units("--serve-port", "70000"), 2,
         ("--serve-port", "70000")),
    Case("ops units --dashboard-port is 0", _units("--dashboard-port", "0"), 2,
         ("--dashboard-port", "0")),
    Case("ops units --dashboard-metrics-port is the dashboard's port",
         _units("--dashboard-metrics-port", "8501"), 2,
         ("--dashboard-metrics-port 8501", "same port as --dashboard-port", "its own port")),
    Case("ops units --metrics-port without --dicomweb", _units("--metrics-port", "9101"), 2,
         ("--metrics-port", "add --dicomweb")),
    Case("ops units --dicomweb plain http off loopback",
         _units("--dicomweb", "http://pacs.example.org/dicom-web"), 2, ("--dicomweb", "https")),
    Case("ops units --allow of 17 characters", _units("--allow", "A" * 17), 2,
         ("--allow", "1 to 16")),
    Case("ops units --answer-to without --allow",
         _units("--answer-to", "ORTHANC@127.0.0.1:4242"), 2, ("--answer-to", "add --allow")),
    Case("ops units --answer-to port above 65535",
         _units("--allow", "CAM", "--answer-to", "ORTHANC@127.0.0.1:70000"), 2,
         ("--answer-to", "65535")),
    Case("pacs listen --quiet is negative", _listen("--quiet", "-1"), 2,
         ("--quiet", "-1.0", "seconds")),
    Case("pacs listen --quiet is nan", _listen("--quiet", "nan"), 2, ("--quiet", "nan")),
    Case("ops promote a run into itself", _promote(into_itself=True), 2,
         ("other than", "outside it")),
    Case("ops promote the model already served", _promote(), 2, ("already serves",)),
    Case("ops promote a run whose weights were changed", _promote(damage=True), 2,
         ("site_", ".safetensors", "cannot read weights")),
    Case("ops rollback of a run never replaced",
         lambda tmp, s: ["ops", "rollback", s.copy_run(tmp)], 2,
         ("never replaced", "nothing to roll back")),
    Case("ops rollback --to a model not kept",
         lambda tmp, s: ["ops", "rollback", s.copy_run(tmp), "--to", "0123456789ab"], 2,
         ("0123456789ab", "not kept")),
    Case("ops releases with an edited history", _history_edited, 2,
         ("history.jsonl:1", "not a release record")),
    Case("pacs make-study --study-date not a date",
         _make_study("--patient-id", "T1", "--study-date", "20241301"), 2,
         ("--study-date", "20241301", "YYYYMMDD")),
    Case("pacs make-study --patient-id with a backslash",
         _make_study("--patient-id", "T\\1"), 2, ("--patient-id", "backslash")),
    Case("pacs make-study --patient-id empty", _make_study("--patient-id", " "), 2,
         ("--patient-id is empty",)),
    Case("pacs make-study --accession too long",
         _make_study("--patient-id", "T1", "--accession", "A" * 17), 2,
         ("--accession", "at most 16")),
    Case("pacs make-study of a photo that does not exist",
         _make_study("--patient-id", "T1", photo="gone.png"), 1, ("gone.png", "no image file")),
    Case("pacs make-study of a text file", _make_study("--patient-id", "T1", photo="notes.txt"),
         1, ("notes.txt", "not a readable image")),
    Case("pacs make-study --modality CT for a photo",
         _make_study("--patient-id", "T1", "--modality", "CT"), 2, ("--modality", "OP")),
    Case("pacs watch --patient-ids not a policy", _watch("--patient-ids", "clear"), 2,
         ("--patient-ids", "'clear'", "hash, plain, none")),
    Case("pacs listen --patient-ids not a policy", _listen("--patient-ids", "mrn"), 2,
         ("--patient-ids", "'mrn'")),
    Case("pacs listen --port above 65535", _listen("--port", "70000"), 2, ("--port", "70000")),
    Case("pacs listen --metrics-port above 65535", _listen("--metrics-port", "70000"), 2,
         ("--metrics-port", "70000")),
    Case("pacs listen --metrics-host is no IP address",
         _listen("--metrics-port", "9100", "--metrics-host", "localhost:9100"), 2,
         ("--metrics-host", "localhost:9100", "not an IP address")),
    Case("pacs listen --answer-to port above 65535",
         _listen("--answer-to", "ORTHANC@127.0.0.1:70000"), 2, ("--answer-to", "65535")),
    Case("pacs listen --answer-to port 0", _listen("--answer-to", "ORTHANC@127.0.0.1:0"), 2,
         ("--answer-to", "not 1 to 65535")),
    Case("pacs listen --ae-title with a backslash", _listen("--ae-title", "MED\\FED"), 2,
         ("--ae-title", "backslash")),
    Case("pacs listen --allow with a control character", _listen("--allow", "CAM\tERA"), 2,
         ("--allow", "printable ASCII")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)
