"""An abstained scan carries no prediction: in the SR written back, the log and review rows."""

from __future__ import annotations

import json

from medfed.clinic.audit import AuditEntry, AuditLog
from medfed.clinic.pacs.answer import answer_texts
from medfed.clinic.route import RoutedScan

ABSTAINED = {
    "time": "2026-12-01T00:00:00+00:00",
    "file": "odd.png",
    "sha256": "0" * 64,
    "router": "density_ratio",
    "status": "abstained",
    "chosen_site": None,
    "site_probs": {"acrima": 0.9, "rimone": 0.1},
    "prediction": "glaucoma",  # what an older medfed put here
    "prediction_prob": 0.979,
    "ood_score": 9.0,
    "reason": "no site fits",
    "nearest": {"site": "acrima", "prediction": "glaucoma", "prediction_prob": 0.979},
    "audit_id": 7,
}


def test_the_sr_of_an_abstained_scan_holds_no_prediction():
    texts = answer_texts(ABSTAINED, "feddrm")

    assert texts["status"] == "abstained"
    assert texts["prediction"].startswith("none: abstained")
    assert "glaucoma" not in texts["prediction"] and "0.979" not in texts["json"]
    written = json.loads(texts["json"])
    assert written["prediction"] is None and written["prediction_prob"] is None
    assert "nearest" not in written


def test_a_routed_sr_names_the_probability_of_its_class_and_the_rule():
    rule = "operating threshold: glaucoma when P(glaucoma) >= 0.800"
    routed = {**ABSTAINED, "status": "routed", "chosen_site": "acrima", "nearest": None,
              "prediction": "normal", "prediction_prob": 0.244, "decision_rule": rule}  # fmt: skip

    texts = answer_texts(routed, "feddrm")

    assert texts["prediction"] == (
        "normal (P(normal) 0.244; decided by operating threshold: glaucoma when "
        "P(glaucoma) >= 0.800)"
    )


def test_an_abstained_row_reads_back_without_a_prediction(tmp_path):
    entry = AuditEntry(**{k: v for k, v in ABSTAINED.items() if k not in {"nearest", "audit_id"}})

    (audit_id,) = AuditLog(tmp_path).append([entry])
    (read,) = AuditLog(tmp_path).read()

    assert audit_id == 1
    assert read.prediction is None and read.prediction_prob is None


def test_route_json_of_an_abstained_scan_has_no_prediction_but_a_labelled_nearest():
    entry = AuditEntry(
        **{**ABSTAINED, "prediction": None, "prediction_prob": None, "audit_id": None}
    )

    out = RoutedScan(entry).to_dict()
    text = RoutedScan(entry).describe()

    assert out["prediction"] is None and out["prediction_prob"] is None
    assert out["nearest"]["site"] == "acrima" and "audit_id" not in out
    assert "glaucoma" not in text and "no answer" in text
