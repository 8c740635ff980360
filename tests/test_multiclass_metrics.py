"""Multi-class figures against scikit-learn: per-class and macro one-vs-rest AUC with CIs,
quadratic weighted kappa with a patient bootstrap CI, and the referable-DR endpoint."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, roc_auc_score

from medfed.metrics import (
    ClassAUC,
    MulticlassFigure,
    macro_auc,
    per_class_auc,
    quadratic_kappa,
    referable,
    site_metrics,
)

K = 5


def _graded(n: int, seed: int, skill: float = 1.5) -> tuple[np.ndarray, np.ndarray]:
    """Grades 0-4 and softmax scores that lean towards the true grade."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, size=n)
    logits = rng.normal(0.0, 1.0, size=(n, K)) - skill * np.abs(np.arange(K)[None, :] - y[:, None])
    p = np.exp(logits)
    return y, p / p.sum(axis=1, keepdims=True)


def test_per_class_auc_equals_sklearn_one_vs_rest() -> None:
    y, p = _graded(200, 0)

    figures = per_class_auc(y, p, names={0: "no_dr"})

    assert [f.cls for f in figures] == list(range(K))
    assert figures[0].name == "no_dr" and figures[1].name == "1"
    for f in figures:
        assert f.auc == pytest.approx(roc_auc_score(y == f.cls, p[:, f.cls]), abs=1e-12)
        assert f.interval is not None and f.interval.low <= f.auc <= f.interval.high
        assert f.n_pos == int((y == f.cls).sum()) and f.n_pos + f.n_neg == y.size


def test_per_class_auc_of_an_absent_class_is_none_with_a_reason() -> None:
    y, p = _graded(120, 1)
    y = np.where(y == 4, 3, y)

    absent = per_class_auc(y, p)[4]

    assert absent.auc is None and absent.interval is None
    assert absent.n_pos == 0 and "too few" in absent.reason
    assert ClassAUC.from_dict(absent.to_dict()) == absent


def test_macro_auc_equals_sklearn_ovr_macro_and_its_ci_holds_it() -> None:
    y, p = _graded(300, 2)

    figure = macro_auc(y, p, n_boot=500)

    expected = roc_auc_score(y, p, multi_class="ovr", average="macro")
    assert figure.value == pytest.approx(expected, abs=1e-12)
    assert figure.interval is not None
    assert figure.interval.low < figure.value < figure.interval.high
    assert "scan-level bootstrap" in figure.interval.method
    assert MulticlassFigure.from_dict(figure.to_dict()) == figure


def test_macro_auc_averages_the_present_classes_as_site_metrics_does() -> None:
    y, p = _graded(150, 3)
    y = np.where(y == 4, 0, y)

    figure = macro_auc(y, p, n_boot=200)

    expected = np.mean([roc_auc_score(y == c, p[:, c]) for c in range(4)])
    assert figure.value == pytest.approx(expected, abs=1e-12)
    assert figure.value == pytest.approx(site_metrics(y, p).auc, abs=1e-12)


def test_macro_auc_of_one_class_is_undefined() -> None:
    _, p = _graded(20, 4)

    figure = macro_auc(np.full(20, 2), p)

    assert figure.value is None and figure.interval is None and "only class 2" in figure.reason


def test_patient_clustering_resamples_patients_not_scans() -> None:
    y, p = _graded(200, 5)
    # Two eyes per patient with the same grade and nearly the same scores.
    y = np.repeat(y[:100], 2)
    p = np.repeat(p[:100], 2, axis=0)
    patients = np.repeat(np.arange(100), 2)

    by_scan = macro_auc(y, p, n_boot=800, seed=1)
    by_patient = macro_auc(y, p, patients, n_boot=800, seed=1)

    assert "patient-clustered" in by_patient.interval.method
    assert "100 patients" in by_patient.interval.method
    width = lambda f: f.interval.high - f.interval.low  # noqa: E731
    assert width(by_patient) > 1.2 * width(by_scan)  # scans of one patient are not independent


def test_quadratic_kappa_equals_sklearn() -> None:
    y, p = _graded(250, 6)
    pred = p.argmax(axis=1)

    figure = quadratic_kappa(y, pred, K, n_boot=500)

    assert figure.value == pytest.approx(cohen_kappa_score(y, pred, weights="quadratic"), 1e-12)
    assert figure.interval.low < figure.value < figure.interval.high
    assert figure.n == 250


def test_each_bootstrap_kappa_equals_sklearn_on_that_resample() -> None:
    from medfed.metrics import multiclass

    y, p = _graded(60, 7, skill=0.8)
    pred = p.argmax(axis=1)
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, 60, size=60) for _ in range(5)]
    weights = np.stack([np.bincount(d, minlength=60) for d in draws]).astype(float)

    kappas = multiclass._weighted_kappas(y, pred, K, weights)

    for d, kappa in zip(draws, kappas, strict=True):
        expected = cohen_kappa_score(y[d], pred[d], weights="quadratic", labels=list(range(K)))
        assert kappa == pytest.approx(expected, abs=1e-10)


def test_kappa_interval_resamples_patients() -> None:
    y, p = _graded(100, 8)
    pred = p.argmax(axis=1)
    y2, pred2, patients = np.repeat(y, 2), np.repeat(pred, 2), np.repeat(np.arange(100), 2)

    figure = quadratic_kappa(y2, pred2, K, patients, n_boot=300)

    assert figure.value == pytest.approx(cohen_kappa_score(y, pred, weights="quadratic"), 1e-12)
    assert "patient-clustered bootstrap of the quadratic weighted kappa" in figure.interval.method


def test_kappa_is_undefined_when_every_grade_is_the_same() -> None:
    figure = quadratic_kappa(np.zeros(10, int), np.zeros(10, int), K)

    assert figure.value is None and "kappa undefined" in figure.reason


def test_perfect_and_reversed_grading() -> None:
    y = np.repeat(np.arange(K), 4)

    assert quadratic_kappa(y, y, K, n_boot=50).value == pytest.approx(1.0)
    assert quadratic_kappa(y, K - 1 - y, K, n_boot=50).value == pytest.approx(-1.0)


def test_referable_endpoint_is_grade_two_or_more_scored_by_its_probability() -> None:
    y, p = _graded(40, 9)

    y_ref, score = referable(y, p, 2)

    assert np.array_equal(y_ref, (y >= 2).astype(int))
    assert np.allclose(score, p[:, 2] + p[:, 3] + p[:, 4])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda y, p: referable(y, p, 0), "from_class must be between 1 and 4"),
        (lambda y, p: referable(y, p, 5), "from_class must be between 1 and 4"),
        (lambda y, p: macro_auc(y, p[:, :4] / p[:, :4].sum(1, keepdims=True)), "labels in"),
        (lambda y, p: macro_auc(y, p * 2), "must lie in"),
        (lambda y, p: quadratic_kappa(y, y[:-1], K), "equally long"),
        (lambda y, p: quadratic_kappa(y, y + 1, K), "labels in"),
        (lambda y, p: per_class_auc(y, p, patients=np.arange(3)), "one id per scan"),
    ],
)
def test_bad_input_is_refused_with_a_reason(call, message: str) -> None:
    y, p = _graded(30, 10)
    y[0] = 4

    with pytest.raises(ValueError, match=message):
        call(y, p)
