"""How the watcher finds studies with new instances, whatever their StudyDate.

A study stored today may carry last year's StudyDate (a backdated or migrated study), so no
search by date finds every new one. Two ways that do not depend on it:

- **Orthanc's change feed** (``GET /changes?since=SEQ``): every instance stored, in order,
  with a sequence number. The watcher remembers the last number whose studies it handled
  (``RUN/pacs.sqlite``); after a restart it goes on from there. A feed whose last number is
  below the remembered one belongs to a new Orthanc database: it is read again from the start.
- **A sweep** (QIDO-RS, any DICOMweb server): every study, each poll, with its instance count
  (NumberOfStudyRelatedInstances); a study is examined when the count differs from the one
  recorded when it was last examined whole (the seen-set), or when the server gives no count.

Either way each batch's studies are handled before its position is recorded, so a crash
re-reads a batch; the scans already answered or skipped (``RUN/pacs.sqlite``) are never
answered again, which makes re-reading harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from medfed.clinic.pacs.connection import TIMEOUT_S, PacsUnreachable, call, check_url
from medfed.clinic.pacs.records import PacsLog
from medfed.core.errors import ConfigError

__all__ = [
    "FINDERS", "Batch", "ChangeFeed", "StudySweep", "all_studies", "finder", "orthanc_root"
]  # fmt: skip

FINDERS = ("auto", "changes", "sweep")
PAGE = 100
_STUDY_UID, _INSTANCES = "0020000D", "00201208"


@dataclass
class Batch:
    """Studies to examine; ``commit`` records that they were all handled."""

    studies: list[str]
    commit: Callable[[], None]


def _value(obj: dict[str, Any], tag: str) -> str:
    values = (obj.get(tag) or {}).get("Value") or [""]
    return str(values[0] if values[0] is not None else "").strip()


def all_studies(source: str, client: Any) -> Iterator[list[dict[str, Any]]]:
    """Every study of the DICOMweb server, a page (QIDO-RS result) at a time."""
    offset = 0
    while True:
        page = call(
            source,
            "searching studies (QIDO-RS)",
            lambda o=offset: client.search_for_studies(
                fields=["NumberOfStudyRelatedInstances"], limit=PAGE, offset=o
            ),
        )
        yield page
        if len(page) < PAGE:
            return
        offset += len(page)


def orthanc_root(dicomweb: str, orthanc: str | None) -> str | None:
    """Orthanc's REST root: ``orthanc`` when given, else the DICOMweb root without its
    ``/dicom-web`` (Orthanc's default); None when neither names one."""
    if orthanc is not None:
        return check_url(orthanc, "--orthanc")
    if dicomweb.rstrip("/").endswith("/dicom-web"):
        return dicomweb.rstrip("/")[: -len("/dicom-web")]
    return None


@dataclass
class StudySweep:
    """Every study each poll; examined again only when its instance count changed."""

    source: str
    client: Any
    log: PacsLog
    description: str = "sweeping every study (QIDO-RS) against the studies already examined"

    def batches(self) -> Iterator[Batch]:
        for page in all_studies(self.source, self.client):
            counts: dict[str, int | None] = {}
            for study in page:
                uid, count = _value(study, _STUDY_UID), _value(study, _INSTANCES)
                counts[uid] = int(count) if count.isdigit() else None
            seen = self.log.seen_counts(self.source, [uid for uid in counts if uid])
            todo = [uid for uid, n in counts.items() if uid and (n is None or seen.get(uid) != n)]
            known = {uid: n for uid, n in counts.items() if uid in todo and n is not None}
            yield Batch(todo, lambda k=known: self.log.mark_seen(self.source, k))


@dataclass
class ChangeFeed:
    """Orthanc's change feed at ``root`` (its REST API, beside the DICOMweb plugin)."""

    source: str
    root: str
    session: Any  # requests.Session, with the PACS's credentials
    log: PacsLog
    warn: Callable[[str], None] = print
    _studies: dict[str, str | None] = field(default_factory=dict)  # Orthanc series id -> UID

    @property
    def description(self) -> str:
        return f"reading Orthanc's change feed ({self.root}/changes)"

    def _get(self, path: str, what: str, missing_ok: bool = False) -> Any:
        def get() -> Any:
            answer = self.session.get(self.root + path, timeout=TIMEOUT_S)
            if missing_ok and answer.status_code == 404:
                return None
            answer.raise_for_status()
            return answer.json()

        return call(self.source, what, get)

    def offered(self) -> bool:
        """Whether ``root`` answers as Orthanc's change feed (404 or not JSON: it does not)."""
        try:
            last = self._get("/changes?last", "reading Orthanc's change feed", missing_ok=True)
        except PacsUnreachable as exc:
            status = getattr(getattr(exc.__cause__, "response", None), "status_code", None)
            if status in (401, 403) or status is None and not _is_json_error(exc.__cause__):
                raise
            return False
        return isinstance(last, dict) and isinstance(last.get("Last"), int)

    def batches(self) -> Iterator[Batch]:
        self._studies.clear()  # this poll's; Orthanc's ids are stable, but the PACS grows
        since = self.log.feed_seq(self.source) or 0
        last = self._get("/changes?last", "reading Orthanc's change feed")
        newest = int(last.get("Last", 0)) if isinstance(last, dict) else 0
        if since > newest:
            self.warn(
                f"warning: {self.root}/changes ends at change {newest}, before change {since} "
                "read last: a new Orthanc database; reading its changes from the start "
                "(scans answered before are not answered again)"
            )
            since = 0
        while True:
            page = self._get(f"/changes?since={since}&limit={PAGE}", "reading the change feed")
            changes = page.get("Changes") or []
            ids = [c["ID"] for c in changes if c.get("ChangeType") == "NewInstance"]
            studies = list(dict.fromkeys(s for s in map(self._study_of, ids) if s))
            since = int(page.get("Last", since))
            yield Batch(studies, lambda s=since: self.log.set_feed_seq(self.source, s))
            if page.get("Done", True) or not changes:
                return

    def _study_of(self, instance: str) -> str | None:
        """The StudyInstanceUID of Orthanc's instance ``instance`` (None once deleted)."""
        found = self._get(f"/instances/{instance}", "reading a new instance", missing_ok=True)
        series = (found or {}).get("ParentSeries")
        if not series:
            return None
        if series not in self._studies:
            about = self._get(f"/series/{series}/study", "reading a study", missing_ok=True)
            tags = (about or {}).get("MainDicomTags") or {}
            self._studies[series] = str(tags.get("StudyInstanceUID") or "").strip() or None
        return self._studies[series]


def _is_json_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` says an answer was not JSON (the root is no Orthanc)."""
    return isinstance(exc, ValueError)


def finder(
    kind: str, source: str, client: Any, session: Any, log: PacsLog, root: str | None,
    warn: Callable[[str], None],
) -> StudySweep | ChangeFeed:  # fmt: skip
    """The finder ``kind`` names (``auto``: the change feed when ``root`` offers one)."""
    if kind not in FINDERS:
        raise ConfigError(f"--find {kind!r}: expected one of {', '.join(FINDERS)}")
    sweep = StudySweep(source, client, log)
    if kind == "sweep":
        return sweep
    if root is None:
        if kind == "changes":
            raise ConfigError(
                f"--find changes: {source} does not end in /dicom-web; name Orthanc's REST "
                "root with --orthanc (e.g. https://pacs.example.org)"
            )
        return sweep
    feed = ChangeFeed(source, root, session, log, warn)
    if feed.offered():
        return feed
    if kind == "changes":
        raise ConfigError(
            f"--find changes: {root}/changes is not Orthanc's change feed; name Orthanc's REST "
            "root with --orthanc, or use --find sweep"
        )
    return sweep
