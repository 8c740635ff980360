"""``medfed pacs watch --dicomweb URL``: the DICOMweb inbox.

Each poll finds the studies with new instances (:mod:`medfed.clinic.pacs.finding`: Orthanc's change
feed, or a sweep of every study against those already examined; never by StudyDate, so a
backdated study stored late is found), lists each study's series, fetches those of the run's
modality (WADO-RS), answers each scan once (:mod:`medfed.clinic.pacs.handling`) and stores the
answer in the study (STOW-RS). Series of another modality are recorded as skipped, with why,
once; medfed's own reports (SR) and other non-image objects are passed over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError

from medfed.clinic.pacs.connection import TIMEOUT_S, PacsUnreachable, call, check_url, make_session
from medfed.clinic.pacs.credentials import PacsCredentials
from medfed.clinic.pacs.finding import ChangeFeed, StudySweep, finder, orthanc_root
from medfed.clinic.pacs.handling import Inbox, Outcome, wrong_modality
from medfed.clinic.pacs.instances import NOT_IMAGES, PHOTO_MODALITIES, Ids, kind_of
from medfed.core.errors import DataError

if TYPE_CHECKING:
    from medfed.ops.telemetry import WatchMetrics

__all__ = ["DicomwebWatcher", "PacsUnreachable", "check_url", "stamped"]

_SERIES_UID, _MODALITY, _SOP_UID = "0020000E", "00080060", "00080018"


# What the series listing asks for: the modality, and the study's attributes a skipped series
# is recorded with (the PACS may leave them out; the series is then recorded without them).
LISTED = ["Modality", "AccessionNumber", "StudyDate", "PatientID"]


def _listing(listed: dict[str, Any] | None) -> Dataset | None:
    """A series listing (DICOM JSON) as a dataset, or None when it cannot be read as one."""
    if not listed:
        return None
    try:
        return Dataset.from_json(listed)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def _value(obj: dict[str, Any], tag: str) -> str:
    values = (obj.get(tag) or {}).get("Value") or [""]
    return str(values[0] or "").strip()


def stamped(text: str) -> str:
    """``text`` after the time (UTC), as a log line a journal or a cron mail can be read by."""
    return f"{datetime.now(UTC).isoformat(timespec='seconds')} {text}"


@dataclass
class DicomwebWatcher:
    """Polls one DICOMweb service for one run."""

    inbox: Inbox
    client: Any  # dicomweb_client.DICOMwebClient
    session: Any = None  # requests.Session: the client's, with the PACS's credentials
    find: str = "auto"  # how new studies are found: auto, changes, sweep
    root: str | None = None  # Orthanc's REST root (its change feed), when known
    warn: Callable[[str], None] = print
    metrics: WatchMetrics | None = None  # --metrics-port: polls, lag, queue depth, scans
    _finder: ChangeFeed | StudySweep | None = None

    @classmethod
    def connect(
        cls, inbox: Inbox, url: str, creds: PacsCredentials | None = None,
        ca_file: str | None = None, find: str = "auto", orthanc: str | None = None,
        warn: Callable[[str], None] = print,
    ) -> DicomwebWatcher:  # fmt: skip
        """A watcher of ``url``; ``find`` and ``orthanc`` say how new studies are found."""
        from dicomweb_client.api import DICOMwebClient

        url = check_url(url)
        session = make_session(creds or PacsCredentials(), ca_file)
        client = DICOMwebClient(url, session=session, timeout=TIMEOUT_S)
        client.set_http_retry_params(retry=False)  # the next poll is the retry
        root = None if find == "sweep" else orthanc_root(url, orthanc)
        return cls(inbox, client, session, find, root, warn)

    def call(self, what: str, request: Callable[[], Any]) -> Any:
        """``request()``; PacsUnreachable saying what failed and what to check otherwise."""
        return call(self.inbox.source, what, request)

    @property
    def finder(self) -> ChangeFeed | StudySweep:
        """How new studies are found; decided at the first poll the PACS answers."""
        if self._finder is None:
            log = self.inbox.log
            self._finder = finder(
                self.find, self.inbox.source, self.client, self.session, log, self.root,
                self.warn,
            )  # fmt: skip
            self.warn(f"finding new studies by {self._finder.description}")
        return self._finder

    def poll(self) -> list[Outcome]:
        """One pass over the studies with new instances; the scans answered or skipped."""
        outcomes: list[Outcome] = []
        for batch in self.finder.batches():
            if self.metrics is not None:
                self.metrics.queue.inc(len(batch.studies))
            for study in batch.studies:
                outcomes += self.answer_study(study)
                if self.metrics is not None:
                    self.metrics.queue.dec()
            batch.commit()  # only once every study of the batch was handled
        return outcomes

    def answer_study(self, study: str) -> list[Outcome]:
        series = self.call(
            f"listing the series of study {study} (QIDO-RS)",
            lambda: self.client.search_for_series(study, fields=LISTED),
        )
        outcomes = []
        for one in series:
            modality, uid = _value(one, _MODALITY).upper(), _value(one, _SERIES_UID)
            if modality in NOT_IMAGES:
                continue
            outcomes += self._series(study, uid, modality, one)
        return outcomes

    def _series(
        self, study: str, series: str, modality: str, listed: dict[str, Any] | None = None
    ) -> list[Outcome]:
        inbox = self.inbox
        if kind_of(modality) != inbox.fed.modality:  # recorded once, with why
            reason = wrong_modality(modality, inbox.fed.modality)
            return [inbox.skip(Ids(study, series), modality, reason, _listing(listed))]
        photo = modality in PHOTO_MODALITIES
        found = inbox.log.get(Ids(study, series).key)  # a CT series, or a skipped series
        if found is not None and found.status != "pending":
            return [Outcome(found, new=False)]
        if photo and self._all_known(study, series):
            return []
        try:
            instances: list[Dataset] = self.call(
                f"fetching series {series} of study {study} (WADO-RS)",
                lambda: self.client.retrieve_series(study, series),
            )
        except InvalidDicomError as exc:  # e.g. an object stored without its Part 10 header
            reason = f"unreadable: the PACS returned an object that is not a DICOM file ({exc})"
            return [inbox.skip(Ids(study, series), modality, reason)]
        if not instances:
            return [inbox.skip(Ids(study, series), modality, "unreadable: the series is empty")]
        if photo:
            return [self._one(Ids(study, series), modality, [ds]) for ds in instances]
        return [self._one(Ids(study, series), modality, instances)]

    def _all_known(self, study: str, series: str) -> bool:
        """Whether every photo of the series was answered or skipped (no fetch needed)."""
        listed = self.call(
            f"listing the instances of series {series} (QIDO-RS)",
            lambda: self.client.search_for_instances(study, series, fields=["SOPInstanceUID"]),
        )
        keys = [Ids(study, series, _value(i, _SOP_UID)).key for i in listed]
        done = [self.inbox.log.get(k) for k in keys]
        return bool(keys) and all(d is not None and d.status != "pending" for d in done)

    def _one(self, listed: Ids, modality: str, instances: list[Dataset]) -> Outcome:
        """Answer one scan; one whose own UIDs are missing or malformed is skipped under the
        series the PACS listed it in."""
        try:
            return self.inbox.handle(instances, self._store)
        except DataError as exc:
            return self.inbox.skip(listed, modality, f"unreadable: {exc}", instances[0])

    def _store(self, report: Dataset) -> None:
        self.call(
            f"storing the answer in study {report.StudyInstanceUID} (STOW-RS)",
            lambda: self.client.store_instances([report], report.StudyInstanceUID),
        )

    def _count(self, outcome: Outcome) -> None:
        if self.metrics is not None:
            skipped = outcome.scan.status == "skipped"
            self.metrics.scans.labels("skipped" if skipped else "answered").inc()

    def watch(
        self, interval: float, echo: Callable[[str], None], polls: int | None,
        max_failures: int = 0,
    ) -> int:  # fmt: skip
        """Poll every ``interval`` seconds, ``polls`` times or until interrupted, or until
        ``max_failures`` polls in a row could not reach the PACS (0: never give up). Each
        failed poll is a log line through ``warn``; returns how many polls failed."""
        done = failed = in_a_row = 0
        while polls is None or done < polls:
            try:
                for outcome in self.poll():
                    if outcome.new:
                        echo(outcome.describe())
                        self._count(outcome)
                in_a_row = 0
                if self.metrics is not None:
                    self.metrics.polled(ok=True)
            except PacsUnreachable as exc:
                failed, in_a_row = failed + 1, in_a_row + 1
                if self.metrics is not None:
                    self.metrics.polled(ok=False)
                self.warn(stamped(f"error: {exc}"))
                if max_failures and in_a_row >= max_failures:
                    self.warn(stamped(f"error: {in_a_row} polls in a row failed; stopping"))
                    return failed
            done += 1
            if polls is None or done < polls:
                time.sleep(interval)
        return failed
