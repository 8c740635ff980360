"""``medfed pacs listen``: a DICOM listener (C-STORE SCP) for sites without DICOMweb.

Only the calling AE titles on the allow-list may associate (others are rejected at
association). Each received instance is written to ``RUN/pacs/incoming/<series>/`` at once (a
restart finds what was received and answers it); a series is answered once no instance of it
arrived for the quiet time: its photos one by one, a CT series as a whole, through the same
:class:`~medfed.clinic.pacs.handling.Inbox` as the DICOMweb watcher. The answer (a Basic Text SR) is
kept in ``RUN/pacs/answers/`` and, with a destination, sent there by C-STORE.
"""

from __future__ import annotations

import shutil
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medfed.clinic.pacs.answer import BASIC_TEXT_SR
from medfed.clinic.pacs.handling import Inbox, Outcome
from medfed.clinic.pacs.instances import NOT_IMAGES, PHOTO_MODALITIES, modality_of, uid
from medfed.core.errors import ConfigError, DataError, MedfedError
from medfed.core.fileio import private_dir, private_file

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

__all__ = ["Destination", "Listener", "parse_destination"]

INCOMING = Path("pacs") / "incoming"
# What the listener accepts: CT, ophthalmic photos and secondary captures.
STORAGE_CLASSES = (
    "1.2.840.10008.5.1.4.1.1.2",  # CT Image Storage
    "1.2.840.10008.5.1.4.1.1.2.1",  # Enhanced CT Image Storage
    "1.2.840.10008.5.1.4.1.1.77.1.5.1",  # Ophthalmic Photography 8 Bit
    "1.2.840.10008.5.1.4.1.1.77.1.5.2",  # Ophthalmic Photography 16 Bit
    "1.2.840.10008.5.1.4.1.1.7",  # Secondary Capture
    "1.2.840.10008.5.1.4.1.1.77.1.4",  # VL Photographic Image
)
_SUCCESS, _CANNOT_UNDERSTAND, _OUT_OF_RESOURCES = 0x0000, 0xC000, 0xA700


class SendError(MedfedError):
    """The answer could not be sent to the destination (it stays pending and is sent again)."""


@dataclass(frozen=True)
class Destination:
    """Where answers are sent by C-STORE: an AE title at a host and port."""

    ae_title: str
    host: str
    port: int


def parse_destination(text: str) -> Destination:
    """``AET@host:port``; ConfigError otherwise."""
    title, at, rest = text.partition("@")
    host, colon, port = rest.rpartition(":")
    if not (at and colon and title.strip() and host and port.isdigit()):
        raise ConfigError(
            f"--answer-to {text!r}: expected AE_TITLE@HOST:PORT, e.g. ORTHANC@pacs:4242"
        )
    if len(title.strip()) > 16:
        raise ConfigError(f"--answer-to {text!r}: an AE title has at most 16 characters")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"--answer-to {text!r}: the port {int(port)} is not 1 to 65535")
    return Destination(title.strip(), host, int(port))


@dataclass
class Listener:
    """The C-STORE SCP of one run; ``quiet``: seconds without a new instance that end a series."""

    inbox: Inbox
    ae_title: str
    allowed: tuple[str, ...]
    quiet: float = 10.0
    destination: Destination | None = None
    echo: Any = print
    _seen: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _server: Any = None
    _worker: threading.Thread | None = None
    metrics: Any = None  # a telemetry.ListenMetrics, or None

    def waiting(self) -> int:
        """Series received and waiting for their quiet time."""
        with self._lock:
            return len(self._seen)

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.received(result)

    def __post_init__(self) -> None:
        if not self.allowed:
            raise ConfigError("give at least one --allow AE title: no caller may store otherwise")
        for option, title in (
            ("--ae-title", self.ae_title),
            *(("--allow", t) for t in self.allowed),
        ):
            if not title.strip() or len(title) > 16:
                raise ConfigError(f"{option}: AE title {title!r}: 1 to 16 characters")
            if any(c == "\\" or not " " <= c <= "~" for c in title):
                raise ConfigError(
                    f"{option}: AE title {title!r} holds a backslash or a character outside "
                    "printable ASCII, which DICOM does not allow; use letters, digits, spaces "
                    "and punctuation other than a backslash"
                )

    @property
    def incoming(self) -> Path:
        return self.inbox.run / INCOMING

    def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Listen on ``host:port`` (in threads) and answer quiet series until :meth:`stop`."""
        from pynetdicom import AE, evt
        from pynetdicom.presentation import build_context

        ae = AE(ae_title=self.ae_title)
        ae.require_calling_aet = list(self.allowed)
        ae.supported_contexts = [build_context(c) for c in STORAGE_CLASSES]
        for series in self._spooled():  # received before a restart: answered after the quiet
            self._seen[series] = time.monotonic()
        handlers = [(evt.EVT_C_STORE, self._on_store)]
        self._server = ae.start_server(
            (host, port), block=False, evt_handlers=handlers, ssl_context=tls
        )
        self._worker = threading.Thread(target=self._loop, name="medfed-series", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
        if self._worker is not None:
            self._worker.join(timeout=30)

    def _spooled(self) -> list[str]:
        if not self.incoming.is_dir():
            return []
        return sorted(p.name for p in self.incoming.iterdir() if p.is_dir())

    def _on_store(self, event: Any) -> int:
        """Keep one received instance (written whole before it is acknowledged)."""
        try:
            ds = event.dataset
            ds.file_meta = event.file_meta
            if modality_of(ds) in NOT_IMAGES or ds.SOPClassUID == BASIC_TEXT_SR:
                self._count("ignored")
                return _SUCCESS  # a report, e.g. an answer sent back to us: nothing to route
            uid(ds.get("StudyInstanceUID"), "StudyInstanceUID")  # refused now, not later
            series = uid(ds.get("SeriesInstanceUID"), "SeriesInstanceUID")
            sop = uid(ds.get("SOPInstanceUID"), "SOPInstanceUID")
            folder = self.incoming / series
            private_dir(folder)
            partial = folder / f".{sop}.partial"
            ds.save_as(partial, enforce_file_format=True)
            private_file(partial)
            partial.replace(folder / f"{sop}.dcm")
        except DataError as exc:
            self.echo(f"refused an instance from {event.assoc.requestor.ae_title}: {exc}")
            self._count("refused")
            return _CANNOT_UNDERSTAND
        except OSError as exc:
            self.echo(f"warning: cannot keep a received instance ({exc})")
            self._count("failed")
            return _OUT_OF_RESOURCES
        with self._lock:
            self._seen[series] = time.monotonic()
        self._count("kept")
        return _SUCCESS

    def _loop(self) -> None:
        while not self._stop.wait(min(0.2, self.quiet / 4)):
            self.flush()

    def flush(self, force: bool = False) -> list[Outcome]:
        """Answer every series quiet for ``quiet`` seconds (every series with ``force``)."""
        now = time.monotonic()
        with self._lock:
            ready = [s for s, t in self._seen.items() if force or now - t >= self.quiet]
            for series in ready:
                del self._seen[series]
        outcomes = []
        for series in ready:
            try:
                outcomes += self._answer(self.incoming / series)
            except Exception as exc:  # kept: tried again after another quiet time
                words = str(exc) if isinstance(exc, MedfedError) else repr(exc)
                self.echo(f"warning: series {series}: {words}; tried again")
                if self.metrics is not None:
                    self.metrics.retries.inc()
                with self._lock:
                    self._seen.setdefault(series, time.monotonic())
        return outcomes

    def _answer(self, folder: Path) -> list[Outcome]:
        import pydicom

        instances = [pydicom.dcmread(p) for p in sorted(folder.glob("*.dcm"))]
        if not instances:
            shutil.rmtree(folder, ignore_errors=True)
            return []
        if modality_of(instances[0]) in PHOTO_MODALITIES:
            outcomes = [self.inbox.handle([ds], self._send) for ds in instances]
        else:
            outcomes = [self.inbox.handle(instances, self._send)]
        for outcome in outcomes:
            if outcome.new:
                self.echo(outcome.describe())
                if self.metrics is not None:
                    skipped = outcome.scan.status == "skipped"
                    self.metrics.scans.labels("skipped" if skipped else "answered").inc()
        shutil.rmtree(folder, ignore_errors=True)  # every scan of it answered or skipped
        return outcomes

    def _send(self, report: Dataset) -> None:
        if self.destination is None:
            return  # kept in RUN/pacs/answers/ for the site to collect
        from pynetdicom import AE

        d = self.destination
        ae = AE(ae_title=self.ae_title)
        ae.add_requested_context(BASIC_TEXT_SR)
        assoc = ae.associate(d.host, d.port, ae_title=d.ae_title)
        if not assoc.is_established:
            raise SendError(f"{d.ae_title}@{d.host}:{d.port} refused the association")
        try:
            status = assoc.send_c_store(report)
        finally:
            assoc.release()
        code = getattr(status, "Status", None)
        if code != _SUCCESS:
            raise SendError(
                f"{d.ae_title}@{d.host}:{d.port} did not store the answer (status {code})"
            )
