"""The clinical workflow around a trained federation: ``medfed route`` (route.py) and
``medfed serve`` (serve.py), the audit log, kept scans, the review queue and its sheets,
retention, model releases, and the hospital's PACS (:mod:`medfed.clinic.pacs`)."""
