"""``medfed pacs watch --dicomweb URL``: the DICOMweb inbox.

Each poll searches the PACS (QIDO-RS) for studies since the source's checkpoint (their
StudyDate, from the checkpoint's day on), lists each study's series, fetches those of the run's
modality (WADO-RS), answers each scan once (:mod:`medfed.pacs.handling`) and stores the
answer in the study (STOW-RS). Series of another modality are recorded as skipped, with why,
once; medfed's own reports (SR) and other non-image objects are passed over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pydicom.errors import InvalidDicomError

from medfed.errors import ConfigError, DataError, MedfedError
from medfed.pacs.bearer import is_loopback
from medfed.pacs.handling import Inbox, Outcome, wrong_modality
from medfed.pacs.instances import NOT_IMAGES, PHOTO_MODALITIES, Ids, kind_of

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

__all__ = ["DicomwebWatcher", "PacsUnreachable", "check_url"]

_STUDY_UID, _SERIES_UID, _MODALITY, _STUDY_DATE = "0020000D", "0020000E", "00080060", "00080020"
_PAGE = 100


class PacsUnreachable(MedfedError):
    """The PACS did not answer (network, HTTP error): nothing is recorded, the poll is retried."""


def check_url(url: str) -> str:
    """``url`` when it is http(s); plain http only to a loopback host (TLS everywhere else)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"--dicomweb {url!r}: not an http(s) URL of a DICOMweb service")
    if parsed.scheme == "http" and not is_loopback(parsed.hostname):
        raise ConfigError(
            f"--dicomweb {url}: plain http to another machine would send scans unencrypted; "
            "use https (TLS), e.g. through the PACS's reverse proxy"
        )
    return url.rstrip("/")


def _value(obj: dict[str, Any], tag: str) -> str:
    values = (obj.get(tag) or {}).get("Value") or [""]
    return str(values[0] or "").strip()


@dataclass
class DicomwebWatcher:
    """Polls one DICOMweb service for one run."""

    inbox: Inbox
    client: Any  # dicomweb_client.DICOMwebClient

    @classmethod
    def connect(cls, inbox: Inbox, url: str, token: str | None = None) -> DicomwebWatcher:
        from dicomweb_client.api import DICOMwebClient

        headers = {"Authorization": f"Bearer {token}"} if token else None
        client = DICOMwebClient(check_url(url), headers=headers)
        client.set_http_retry_params(retry=False)  # the next poll is the retry
        return cls(inbox, client)

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        import requests

        try:
            return call()
        except (requests.RequestException, OSError) as exc:
            raise PacsUnreachable(
                f"{self.inbox.source}: {what} failed ({exc}); is the PACS up and the URL right? "
                "Nothing was recorded; the next poll tries again"
            ) from exc

    def _studies(self, since: str | None) -> list[dict[str, Any]]:
        filters = {"StudyDate": f"{since}-"} if since else None
        found, offset = [], 0
        while True:
            page = self._call(
                "searching studies (QIDO-RS)",
                lambda o=offset: self.client.search_for_studies(
                    search_filters=filters, fields=["StudyDate"], limit=_PAGE, offset=o
                ),
            )
            found += page
            if len(page) < _PAGE:
                return found
            offset += len(page)

    def poll(self) -> list[Outcome]:
        """One pass over the studies since the checkpoint; the scans answered or skipped."""
        log = self.inbox.log
        outcomes: list[Outcome] = []
        studies = self._studies(log.checkpoint(self.inbox.source))
        for study in studies:
            outcomes += self._study(_value(study, _STUDY_UID))
        dates = [d for d in (_value(s, _STUDY_DATE) for s in studies) if len(d) == 8]
        if dates:
            log.set_checkpoint(self.inbox.source, max(dates))
        return outcomes

    def _study(self, study: str) -> list[Outcome]:
        series = self._call(
            f"listing the series of study {study} (QIDO-RS)",
            lambda: self.client.search_for_series(study, fields=["Modality"]),
        )
        outcomes = []
        for one in series:
            modality, uid = _value(one, _MODALITY).upper(), _value(one, _SERIES_UID)
            if modality in NOT_IMAGES:
                continue
            outcomes += self._series(study, uid, modality)
        return outcomes

    def _series(self, study: str, series: str, modality: str) -> list[Outcome]:
        inbox = self.inbox
        if kind_of(modality) != inbox.fed.modality:  # recorded once, with why
            reason = wrong_modality(modality, inbox.fed.modality)
            return [inbox.skip(Ids(study, series), modality, reason)]
        photo = modality in PHOTO_MODALITIES
        found = inbox.log.get(Ids(study, series).key)  # a CT series, or a skipped series
        if found is not None and found.status != "pending":
            return [Outcome(found, new=False)]
        if photo and self._all_known(study, series):
            return []
        try:
            instances: list[Dataset] = self._call(
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
        listed = self._call(
            f"listing the instances of series {series} (QIDO-RS)",
            lambda: self.client.search_for_instances(study, series, fields=["SOPInstanceUID"]),
        )
        keys = [Ids(study, series, _value(i, "00080018")).key for i in listed]
        done = [self.inbox.log.get(k) for k in keys]
        return bool(keys) and all(d is not None and d.status != "pending" for d in done)

    def _one(self, listed: Ids, modality: str, instances: list[Dataset]) -> Outcome:
        """Answer one scan; one whose own UIDs are missing or malformed is skipped under the
        series the PACS listed it in."""
        try:
            return self.inbox.handle(instances, self._store)
        except DataError as exc:
            return self.inbox.skip(listed, modality, f"unreadable: {exc}")

    def _store(self, report: Dataset) -> None:
        self._call(
            f"storing the answer in study {report.StudyInstanceUID} (STOW-RS)",
            lambda: self.client.store_instances([report], report.StudyInstanceUID),
        )

    def watch(self, interval: float, echo: Callable[[str], None], polls: int | None) -> None:
        """Poll every ``interval`` seconds (``polls`` times, or until interrupted)."""
        done = 0
        while polls is None or done < polls:
            try:
                for outcome in self.poll():
                    if outcome.new:
                        echo(outcome.describe())
            except PacsUnreachable as exc:
                echo(f"warning: {exc}")
            done += 1
            if polls is None or done < polls:
                time.sleep(interval)
