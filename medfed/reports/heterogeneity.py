"""How heterogeneous a federation is, and which of medfed's synthetic scenarios it resembles
(``medfed sites heterogeneity`` and the dashboard's Sites page).

Three kinds of shift, each measured from what a federation already publishes:

* **label shift**: each site's share of every class with its Wilson 95% CI, a chi-square test
  that the sites share one class mix, and the Dirichlet concentration ``alpha`` the spread of
  the sites' shares implies (method of moments, sampling noise removed): the same ``alpha``
  as ``medfed synth --label-alpha`` draws sites with.
* **covariate shift**: the MMD² between sites' preprocessed scans
  (``medfed.data.distances``, as ``medfed sites check`` prints it). Its mean over site pairs
  is placed in bands measured on medfed's own synthetic federations, by synthesizing each
  ``--covariate-shift`` level (3 sites, 60 scans per site, seeds 0 and 1; mean pairwise MMD²)
  and putting each band's edge halfway between neighbouring levels:

  ======== ========================= =========================
  level    glaucoma sites (binary)   DR sites (``--task dr``)
  ======== ========================= =========================
  low      0.160 (0.170, 0.151)      0.261 (0.274, 0.247)
  mid      0.582 (0.592, 0.572)      0.924 (0.906, 0.942)
  high     0.799 (0.811, 0.787)      1.088 (1.078, 1.097)
  ======== ========================= =========================

  (mean of the two seeds, each seed's figure in brackets). The bands of a fundus federation
  are those of its task (two classes: glaucoma; five, the ICDR grades: DR); no band is
  calibrated for CT, nor for fundus sites of three or four classes (e.g. four diseases).
* **concept shift** (sites that label by different rules): needs a trained run. Each site's
  model loses some of its own-site figure on another site's test scans; covariate shift
  explains part of that drop. The drops of all ordered site pairs are regressed on the pairs'
  MMD² (OLS); a pair is flagged when its drop exceeds the upper 95% prediction bound of a fit
  to the other pairs (leave-one-out, so a pair cannot hide its own excess). AUC drops show
  rules that rank eyes differently; accuracy drops show rules that draw the line elsewhere
  (another cup-to-disc threshold, another referable grade), which AUC cannot see.

Which method to use in each regime comes from a scenario sweep (every method trained on the
synthetic federation of each regime): ``medfed scenarios`` writes one per ablation
(``OUT/sweep-ABLATION.json``, :func:`read_sweep`'s format). The sweeps measured for
docs/scenarios.md ship with medfed (``medfed/reports/sweeps``) and are read when ``--sweep``
names no others. Of the scenarios of the regime found, those whose number of sites is nearest
the federation's count: the first gives the ranking (point estimates) and each other
measurement of the regime is stated beside it, always with FedDRM's paired intervals against
each method, so that a ranking is never read as more than they show. Everything here is
guidance from synthetic scenarios.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import statsmodels.api as sm
from scipy.stats import chi2_contingency

from medfed.core.errors import MedfedError
from medfed.core.reliability import unreliable
from medfed.metrics import Proportion, wilson
from medfed.reports.markdown import markdown_table
from medfed.reports.text import fmt

GUIDANCE = (
    "Guidance from medfed's synthetic scenarios (medfed synth), not a measurement of which "
    "method is best for this federation."
)
NO_SWEEP = (
    "no scenario sweep given: no method ranking for this regime (medfed scenarios writes one, "
    "OUT/sweep-ABLATION.json; pass it with --sweep FILE)"
)
# The sweeps measured for docs/scenarios.md (each ablation's OUT/sweep-ABLATION.json).
MEASURED_SWEEPS = Path(__file__).with_name("sweeps")
NEEDS_RUN = (
    "needs a trained run: train the federation (medfed train --sites ...) and pass its run "
    "directory with --run RUN"
)

# Mean pairwise MMD² of medfed synth's covariate-shift levels (see the module docstring), and
# the band edges halfway between neighbouring levels.
MEASURED_MMD = {
    "glaucoma": {"low": 0.160, "mid": 0.582, "high": 0.799},
    "dr": {"low": 0.261, "mid": 0.924, "high": 1.088},
}
LEVELS = ("low", "mid", "high")
# Dirichlet concentration bands: at or below the first, strong label shift (--label-alpha 0.5
# or 1 draws such sites); above the second, little beyond sampling noise.
ALPHA_BANDS = (2.0, 20.0)
CONCEPT_FIGURES = ("auc", "accuracy")
ICDR_CLASSES = 5  # a DR federation's classes: the ICDR grades 0-4
MIN_CONCEPT_PAIRS = 4  # a line and a leave-one-out prediction interval need at least this many
LEVEL = 0.95
Z95 = 1.959964
# 2: each scenario says whether its level could tell methods apart (the gate of
# medfed.experiments.scenario_verdicts), with no ranking where it could not.
SWEEP_FORMAT = 2


class HeterogeneityError(MedfedError):
    """The heterogeneity report cannot be made from what was given."""

    exit_code = 2


# ------------------------------------------------------------------------------ label shift


def class_totals(counts: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[str, dict]:
    """Each site's scans per class, summed over its splits (``counts``: site -> split -> class
    -> n, as ``medfed sites check`` and the run's site overview hold them)."""
    totals: dict[str, dict[str, int]] = {}
    for site, splits in counts.items():
        per: dict[str, int] = {}
        for by_class in splits.values():
            for name, n in by_class.items():
                per[name] = per.get(name, 0) + int(n)
        totals[site] = per
    return totals


def prevalences(totals: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Proportion]]:
    """Each site's share of every class (of every class any site has) with its Wilson CI."""
    names = _class_names(totals)
    out = {}
    for site, per in totals.items():
        n = sum(per.values())
        out[site] = {c: wilson(per.get(c, 0), n) for c in names}
    return out


def _class_names(totals: Mapping[str, Mapping[str, int]]) -> list[str]:
    return list(dict.fromkeys(c for per in totals.values() for c in per))


def label_shift(totals: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """Whether the sites share one class mix: chi-square test, the spread of each class's share,
    and the Dirichlet concentration the spread implies (None: no spread beyond sampling)."""
    names = _class_names(totals)
    table = np.array([[per.get(c, 0) for c in names] for per in totals.values()], dtype=float)
    table = table[:, table.sum(axis=0) > 0]
    n = table.sum(axis=1)
    shares = table / n[:, None]
    p_value = None
    if table.shape[1] > 1 and table.shape[0] > 1:
        p_value = float(chi2_contingency(table).pvalue)
    mean = shares.mean(axis=0)
    spread = {c: float(np.ptp(shares[:, k])) for k, c in enumerate(n for n in names)}
    observed = shares.var(axis=0, ddof=1) if len(n) > 1 else np.zeros_like(mean)
    sampling = (mean * (1 - mean))[None, :] / n[:, None]
    excess = float((observed - sampling.mean(axis=0)).sum())
    spread_total = float((mean * (1 - mean)).sum())
    alpha = spread_total / excess - 1.0 if excess > 0 else None
    if alpha is not None:
        alpha = max(alpha, 0.0)
    return {
        "p_value": p_value,
        "share_spread": spread,
        "alpha": alpha,
        "level": _label_level(alpha, p_value),
    }


def _label_level(alpha: float | None, p_value: float | None) -> str:
    if alpha is None or (p_value is not None and p_value >= 1 - LEVEL):
        return "none"
    if alpha <= ALPHA_BANDS[0]:
        return "strong"
    return "moderate" if alpha <= ALPHA_BANDS[1] else "weak"


# -------------------------------------------------------------------------- covariate shift


def bands(task: str) -> dict[str, list[float | None]] | None:
    """Each level's MMD² band ``[low, high]`` (high None: no upper edge) for a fundus task
    ("glaucoma" or "dr"); None: no band calibrated for ``task``."""
    measured = MEASURED_MMD.get(task)
    if measured is None:
        return None
    values = [measured[level] for level in LEVELS]
    edges = [0.0, *(round((a + b) / 2, 4) for a, b in zip(values, values[1:], strict=False))]
    edges.append(None)
    return {level: [edges[k], edges[k + 1]] for k, level in enumerate(LEVELS)}


def pair_distances(distances: Mapping[str, Any] | None) -> dict[tuple[str, str], float]:
    """``{(a, b): MMD²}`` for every ordered pair of a distance matrix (``distance_matrix``)."""
    if not distances:
        return {}
    ids, matrix = distances["sites"], distances["matrix"]
    return {
        (a, b): float(matrix[i][j]) for i, a in enumerate(ids) for j, b in enumerate(ids) if a != b
    }


def covariate_shift(distances: Mapping[str, Any] | None, task: str) -> dict[str, Any]:
    """The mean MMD² over site pairs, and the synthetic level whose band holds it."""
    pairs = pair_distances(distances)
    if not pairs:
        return {"mean_mmd": None, "level": None, "task": task, "bands": bands(task)}
    mean = float(np.mean(list(pairs.values())))
    found = bands(task)
    level = None
    if found is not None:
        level = next(
            name
            for name, (low, high) in found.items()
            if low <= mean and (high is None or mean < high)
        )
    return {"mean_mmd": mean, "level": level, "task": task, "bands": found}


# ---------------------------------------------------------------------------- concept shift


def concept_shift(
    cross: Mapping[str, Mapping[str, float | None]] | None,
    distances: Mapping[str, Any] | None,
    figure: str = "auc",
    sizes: Mapping[str, Mapping[str, int | None]] | None = None,
) -> dict[str, Any]:
    """Each ordered site pair's drop in ``figure`` (a site's model on its own test scans minus
    on the other site's) against the drop the pair's MMD² predicts. ``cross[model][data]``: the
    figure; ``sizes[site]``: its test split's ``n``, ``n_pos``, ``n_neg``.

    A pair is flagged when its drop is above the upper 95% prediction bound of a line fitted to
    the other pairs and, when ``sizes`` are given, its excess over the line is also beyond the
    95% CI of the drop itself (the two cells' standard errors: Hanley-McNeil for an AUC, binomial
    for an accuracy) and neither site's test split has fewer than 10 positives or negatives
    (medfed's reliability line), so that a drop measured on a handful of scans is not flagged."""
    result: dict[str, Any] = {"figure": figure, "pairs": [], "flagged": [], "reason": None}
    if not cross:
        result["reason"] = NEEDS_RUN
        return result
    mmd = pair_distances(distances)
    rows = []
    for model, row in cross.items():
        own = row.get(model)
        for data, value in row.items():
            if data == model or own is None or value is None or (model, data) not in mmd:
                continue
            rows.append({"model": model, "data": data, "mmd": mmd[(model, data)]})
            rows[-1]["drop"] = float(own) - float(value)
            rows[-1]["drop_se"] = _drop_se(figure, own, value, model, data, sizes)
            rows[-1]["unreliable"] = _few(sizes, model, data)
    if len(rows) < MIN_CONCEPT_PAIRS:
        result["reason"] = (
            f"{len(rows)} site pair(s) with both a {figure} and a distance; the indicator needs "
            f"at least {MIN_CONCEPT_PAIRS} (3 sites)"
        )
        return result
    x = np.array([r["mmd"] for r in rows])
    y = np.array([r["drop"] for r in rows])
    for i, r in enumerate(rows):
        r["expected"], r["upper"] = _left_out_bound(x, y, i)
        beyond_ci = r["drop_se"] is None or r["drop"] - r["expected"] > Z95 * r["drop_se"]
        above = math.isfinite(r["upper"]) and r["drop"] > r["upper"]
        r["flag"] = bool(above and beyond_ci and r["unreliable"] is None)
        if not math.isfinite(r["upper"]):
            r["upper"] = None
    result["pairs"] = rows
    result["flagged"] = [f"{r['model']}->{r['data']}" for r in rows if r["flag"]]
    if all(r["unreliable"] for r in rows):
        result["reason"] = (
            f"every site pair's {figure} rests on a test split with fewer than 10 positives or "
            "negatives: not measurable; train on larger sites"
        )
    return result


def _few(sizes: Mapping[str, Mapping[str, int | None]] | None, *sites: str) -> str | None:
    """Why a pair's figures rest on too few test scans (None: enough, or counts unknown)."""
    for site in sites:
        size = (sizes or {}).get(site)
        if size is None:
            continue
        n = size.get("n") or 0
        n_pos = size.get("n_pos") if size.get("n_pos") is not None else n // 2
        n_neg = size.get("n_neg") if size.get("n_neg") is not None else n - n // 2
        if (why := unreliable(n_pos, n_neg)) is not None:
            return f"site {site}'s test split: {why}"
    return None


def _drop_se(
    figure: str,
    own: float,
    other: float,
    model: str,
    data: str,
    sizes: Mapping[str, Mapping[str, int | None]] | None,
) -> float | None:
    """The standard error of one pair's drop (the two cells taken as independent)."""
    if not sizes or model not in sizes or data not in sizes:
        return None
    ses = [_cell_se(figure, float(v), sizes[s]) for v, s in ((own, model), (other, data))]
    if any(se is None for se in ses):
        return None
    return math.sqrt(sum(se**2 for se in ses))  # type: ignore[operator]


def _cell_se(figure: str, value: float, size: Mapping[str, int | None]) -> float | None:
    n = size.get("n") or 0
    if figure == "accuracy":
        return math.sqrt(max(value * (1 - value), 1e-12) / n) if n else None
    # Hanley-McNeil; a graded task's macro AUC taken with its test scans split evenly
    n_pos = size.get("n_pos") or n // 2
    n_neg = size.get("n_neg") or n - n // 2
    if n_pos < 1 or n_neg < 1:
        return None
    q1, q2 = value / (2 - value), 2 * value**2 / (1 + value)
    var = value * (1 - value) + (n_pos - 1) * (q1 - value**2) + (n_neg - 1) * (q2 - value**2)
    return math.sqrt(max(var, 0.0) / (n_pos * n_neg))


def _left_out_bound(x: np.ndarray, y: np.ndarray, i: int) -> tuple[float, float]:
    """The drop predicted at ``x[i]`` by a line through the other pairs, and the upper bound of
    its 95% prediction interval."""
    keep = np.arange(len(x)) != i
    design = sm.add_constant(x[keep], has_constant="add")
    fit = sm.OLS(y[keep], design).fit()
    at = sm.add_constant(np.array([x[i]]), has_constant="add")
    frame = fit.get_prediction(at).summary_frame(alpha=1 - LEVEL)
    return float(frame["mean"].iloc[0]), float(frame["obs_ci_upper"].iloc[0])


# ------------------------------------------------------------------------- the whole report


def task_of(modality: str | None, counts: Mapping[str, Mapping[str, Mapping[str, int]]]) -> str:
    """Whose covariate bands fit: "glaucoma" (two-class fundus), "dr" (fundus in five classes:
    the ICDR grades 0-4) or the modality itself (no band: CT, or fundus sites of other classes,
    such as normal, glaucoma, cataract and dr as four diseases)."""
    if modality != "fundus":
        return str(modality)
    names = {c for splits in counts.values() for per in splits.values() for c in per}
    if len(names) <= 2:
        return "glaucoma"
    return "dr" if len(names) == ICDR_CLASSES else str(modality)


def test_sizes(sites: Mapping[str, Any]) -> dict[str, dict[str, int | None]]:
    """Each site's test split size and class counts, from a run's summary.json ``sites``."""
    return {s: {"n": f.n_test, "n_pos": f.n_pos, "n_neg": f.n_neg} for s, f in sites.items()}


def cross_figures(
    cross: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, dict[str, float | None]]]:
    """A run's cross-site matrix (summary.json ``cross_site``) per figure, as
    :func:`heterogeneity` takes it: ``{figure: {model: {data: value}}}``."""
    return {
        figure: {
            m: {d: getattr(cell, figure) for d, cell in row.items()} for m, row in cross.items()
        }
        for figure in CONCEPT_FIGURES
    }


def read_sweep(path: str | Path) -> dict[str, Any]:
    """A scenario sweep's result file: ``{"format": 2, "source": "...", "scenarios": [{"covariate":
    "low|mid|high", "label": "none|weak|moderate|strong", "concept": bool, "informative": bool,
    "ranking": [method, ...]}]}``, each ranking best first, as measured by training every
    method on the scenario; empty where the level was uninformative (its baselines did not
    clear the most-common-grade rate, so no ranking can be read from it)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeterogeneityError(f"{path}: no such sweep file; give the sweep's results") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeterogeneityError(f"{path}: not a readable JSON sweep file ({exc})") from exc
    except RecursionError:
        raise HeterogeneityError(
            f"{path}: not a readable JSON sweep file (nested too deeply); give the sweep's "
            "results as written by 'medfed scenarios'"
        ) from None
    scenarios = data.get("scenarios") if isinstance(data, dict) else None
    if isinstance(data, dict) and data.get("format") == 1:
        raise HeterogeneityError(
            f"{path}: a sweep of format 1, written before sweeps said which levels could tell "
            "methods apart; run 'medfed scenarios' again (--reuse-runs reads its runs back) to "
            f"write format {SWEEP_FORMAT}"
        )
    if (
        not isinstance(data, dict)
        or data.get("format") != SWEEP_FORMAT
        or not isinstance(scenarios, list)
    ):
        raise HeterogeneityError(
            f"{path}: not a scenario sweep of format {SWEEP_FORMAT} (an object with 'format': "
            f"{SWEEP_FORMAT} and a 'scenarios' list)"
        )
    for k, s in enumerate(scenarios):
        informative = s.get("informative") if isinstance(s, dict) else None
        ok = (
            isinstance(s, dict)
            and isinstance(informative, bool)
            and isinstance(s.get("ranking"), list)
            and (bool(s["ranking"]) or not informative)
        )
        differences = s.get("differences") if isinstance(s, dict) else None
        if differences is not None and not (
            isinstance(differences, dict)
            and all(
                isinstance(d, dict) and isinstance(d.get("verdict"), str)
                for d in differences.values()
            )
        ):
            raise HeterogeneityError(
                f"{path}: scenarios[{k}]['differences'] must map each method to an object "
                "with its 'verdict' (as medfed scenarios writes it)"
            )
        if not ok or s.get("covariate") not in LEVELS or not isinstance(s.get("concept"), bool):
            raise HeterogeneityError(
                f"{path}: scenarios[{k}] needs 'covariate' (one of {list(LEVELS)}), 'label', "
                "'concept' (true or false), 'informative' (true or false) and a 'ranking' list, "
                "not empty where informative"
            )
    return data


def regime(
    label: Mapping[str, Any], covariate: Mapping[str, Any], concepts: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Which synthetic scenario the federation resembles, as ``medfed synth`` options."""
    measured = [c for c in concepts if c["reason"] is None]
    concept = None if not measured else any(c["flagged"] for c in measured)
    options = []
    if covariate["level"] is not None:
        options.append(f"--covariate-shift {covariate['level']}")
    if label["alpha"] is not None and label["level"] != "none":
        options.append(f"--label-alpha {label['alpha']:.2g}")
    if concept:
        options.append("--concept-shift")
    return {
        "covariate": covariate["level"],
        "label": label["level"],
        "concept": concept,
        "resembles": "medfed synth " + " ".join(options) if options else None,
    }


def read_sweeps(paths: Sequence[str | Path]) -> dict[str, Any] | None:
    """Several sweep files read as one (each scenario keeps its file's source); ``None`` for
    no files."""
    scenarios = []
    for path in paths:
        data = read_sweep(path)
        source = data.get("source") or str(path)
        scenarios += [{"source": source, **s} for s in data["scenarios"]]
    if not scenarios:
        return None
    return {"format": SWEEP_FORMAT, "source": "; ".join(map(str, paths)), "scenarios": scenarios}


def measured_sweep() -> dict[str, Any] | None:
    """The sweeps measured for docs/scenarios.md, as shipped with medfed."""
    return read_sweeps(sorted(MEASURED_SWEEPS.glob("sweep-*.json")))


def ranking(
    found: Mapping[str, Any], sweep: Mapping[str, Any] | None, n_sites: int | None = None
) -> dict[str, Any]:
    """The sweep's method ranking for the regime ``found``, with FedDRM's paired differences
    there; or why there is none. Of the scenarios of that regime, those with the number of
    sites nearest ``n_sites`` count: the first gives ``ranking``, the others (other ablations'
    levels that fall in the same regime, each its own measurement) are listed in ``also``, so
    that a regime measured more than once is never read from one of its measurements alone."""
    if sweep is None:
        return {"ranking": None, "note": NO_SWEEP}
    matches = [
        s
        for s in sweep["scenarios"]
        if s["covariate"] == found["covariate"]
        and s.get("label") == found["label"]
        and (found["concept"] is None or s["concept"] == found["concept"])
    ]
    if not matches:
        return {"ranking": None, "note": "the sweep has no scenario of this regime"}
    if n_sites is not None:

        def distance(s: Mapping[str, Any]) -> int:
            return abs(int(s.get("n_sites") or n_sites) - n_sites)

        nearest = min(map(distance, matches))
        matches = [s for s in matches if distance(s) == nearest]
    blind = [s for s in matches if not s["informative"]]
    matches = [s for s in matches if s["informative"]]
    if not matches:
        where = ", ".join(s.get("level", "a level") for s in blind)
        return {
            "ranking": None,
            "note": f"the sweep measured this regime ({where}) but could not tell methods apart "
            "there: its baselines did not clear the most-common-grade rate at the sweep's "
            "budget, so it gives no ranking",
        }
    first, *others = (_measured(s, sweep) for s in matches)
    seen = [(first["ranking"], first["differences"])]
    also = []
    for other in others:  # a level measured twice alike (one federation in two ablations) once
        if (other["ranking"], other["differences"]) not in seen:
            seen.append((other["ranking"], other["differences"]))
            also.append(other)
    return first | {"also": also}


def _measured(s: Mapping[str, Any], sweep: Mapping[str, Any]) -> dict[str, Any]:
    source = s.get("source") or sweep.get("source", "the sweep file")
    where = f" ({s['level']}, {s['n_sites']} sites)" if "level" in s and "n_sites" in s else ""
    return {
        "ranking": list(s["ranking"]),
        "note": f"measured by {source}{where}",
        "reference": s.get("reference"),
        "differences": s.get("differences"),
    }


VERDICT_WORDS = {
    "no difference detected": "no difference detected from",
    "ahead": "ahead of",
    "behind": "behind",
    "not measured": "not measured against",
}


def ranking_text(methods: Mapping[str, Any]) -> str:
    """The ranking with what its intervals show: ``a > b > c (by point estimates of system
    accuracy; feddrm's paired 95% intervals: no difference detected from a, b; ahead of c;
    measured by ...)``, then each other measurement of the regime; or the note of why there
    is none."""
    if not methods["ranking"]:
        return methods["note"]
    text = _one_ranking(methods)
    for other in methods.get("also") or []:
        text += f"; also measured in this regime: {_one_ranking(other)}"
    return text


def _one_ranking(methods: Mapping[str, Any]) -> str:
    text = " > ".join(methods["ranking"]) + " (by point estimates of system accuracy"
    differences = methods.get("differences")
    if differences:
        by_verdict: dict[str, list[str]] = {}
        for method, d in differences.items():
            by_verdict.setdefault(d["verdict"], []).append(method)
        parts = [f"{VERDICT_WORDS.get(v, v)} {', '.join(ms)}" for v, ms in by_verdict.items()]
        reference = methods.get("reference") or "the reference method"
        text += f"; {reference}'s paired 95% intervals: " + "; ".join(parts)
    return text + f"; {methods['note']})"


def heterogeneity(
    counts: Mapping[str, Mapping[str, Mapping[str, int]]],
    distances: Mapping[str, Any] | None,
    task: str,
    cross: Mapping[str, Mapping[str, Mapping[str, float | None]]] | None = None,
    sweep: Mapping[str, Any] | None = None,
    sizes: Mapping[str, Mapping[str, int | None]] | None = None,
) -> dict[str, Any]:
    """The report as JSON-ready data. ``counts``: site -> split -> class -> n; ``distances``:
    the MMD² matrix; ``task``: "glaucoma", "dr" or the modality (bands of the first two);
    ``cross[figure][model][data]``: a trained run's cross-site matrix, per figure; ``sizes``:
    its sites' test split counts (:func:`test_sizes`)."""
    totals = class_totals(counts)
    if len(totals) < 2:
        raise HeterogeneityError(
            f"{len(totals)} site(s) given: heterogeneity is between sites; give at least two"
        )
    empty = [site for site, per in totals.items() if not sum(per.values())]
    if empty:
        raise HeterogeneityError(f"site(s) {', '.join(empty)} have no labelled scans")
    label = label_shift(totals)
    covariate = covariate_shift(distances, task)
    concepts = [concept_shift((cross or {}).get(f), distances, f, sizes) for f in CONCEPT_FIGURES]
    found = regime(label, covariate, concepts)
    return {
        "guidance": GUIDANCE,
        "sites": list(totals),
        "prevalence": {
            site: {c: p.to_dict() for c, p in per.items()}
            for site, per in prevalences(totals).items()
        },
        "absent_classes": {
            site: [c for c, n in per.items() if n == 0] or None
            for site, per in _with_every_class(totals).items()
        },
        "label_shift": label,
        "covariate_shift": covariate,
        "distances": distances,
        "concept_shift": {c["figure"]: c for c in concepts},
        "regime": found,
        "methods": ranking(found, sweep, len(totals)),
    }


def _with_every_class(totals: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    names = _class_names(totals)
    return {site: {c: per.get(c, 0) for c in names} for site, per in totals.items()}


# --------------------------------------------------------------------------------- as text


def prevalence_table(report: Mapping[str, Any]) -> str:
    """Per site: each class's share with its Wilson 95% CI and counts."""
    names = list(next(iter(report["prevalence"].values())))
    rows = []
    for site, per in report["prevalence"].items():
        rows.append([site, *(_share_text(per[c]) for c in names)])
    return markdown_table(["site", *(f"{c} share (95% CI) k/n" for c in names)], rows)


def _share_text(p: Mapping[str, Any]) -> str:
    if p["n"] == 0:
        return "n/a (0 scans)"
    return f"{p['value']:.3f} ({p['low']:.3f}\u2013{p['high']:.3f}) {p['k']}/{p['n']}"


def distance_table(report: Mapping[str, Any]) -> str | None:
    """The MMD² between every two sites."""
    d = report["distances"]
    if not d:
        return None
    rows = [
        [a, *(fmt(float(v), 4) for v in row)]
        for a, row in zip(d["sites"], d["matrix"], strict=True)
    ]
    return markdown_table(["MMD²", *d["sites"]], rows)


def concept_table(concept: Mapping[str, Any]) -> str:
    header = ["model -> data", "MMD²", f"{concept['figure']} drop", "explained", "upper 95%"]
    rows = [
        [
            f"{r['model']} -> {r['data']}",
            fmt(r["mmd"], 4),
            fmt(r["drop"]),
            fmt(r["expected"]),
            fmt(r["upper"]),
            "FLAG" if r["flag"] else ("too few scans" if r["unreliable"] else ""),
        ]
        for r in concept["pairs"]
    ]
    return markdown_table([*header, "concept shift?"], rows)


def heterogeneity_text(report: Mapping[str, Any]) -> str:
    """What ``medfed sites heterogeneity`` prints."""
    label, cov, found = report["label_shift"], report["covariate_shift"], report["regime"]
    lines = [f"Heterogeneity of {len(report['sites'])} sites. {report['guidance']}", ""]
    lines += ["Label shift: each site's class shares (Wilson 95% CI)", prevalence_table(report)]
    for site, absent in report["absent_classes"].items():
        if absent:
            lines.append(f"  site {site} has no scans of class(es) {', '.join(absent)}")
    alpha = "none beyond sampling noise" if label["alpha"] is None else fmt(label["alpha"], 2)
    lines += [
        f"  chi-square test of one class mix: p = {fmt(label['p_value'], 4)}; "
        f"Dirichlet concentration alpha: {alpha}; label shift: {label['level']}",
        "",
        "Covariate shift: MMD² between the sites' scans",
    ]
    table = distance_table(report)
    lines.append(table or "  no distances (fewer than two sites of one modality with scans)")
    lines.append("  " + _covariate_line(cov))
    lines += ["", "Concept shift: drops across sites beyond what covariate shift explains"]
    concepts = list(report["concept_shift"].values())
    if all(c["reason"] == NEEDS_RUN for c in concepts):
        concepts = []
        lines.append(f"  {NEEDS_RUN}")
    for concept in concepts:
        if concept["reason"] is not None:
            lines.append(f"  {concept['figure']}: {concept['reason']}")
            continue
        lines.append(concept_table(concept))
        flagged = ", ".join(concept["flagged"]) or "none"
        lines.append(f"  {concept['figure']}: flagged pairs: {flagged}")
    lines += ["", "Regime (guidance from medfed's synthetic scenarios)"]
    unknown = "unknown (needs a run)" if not concepts else "not measured (see above)"
    concept_word = {None: unknown, True: "flagged", False: "none flagged"}
    lines.append(
        f"  covariate: {cov['level'] or 'not calibrated'}; label: {found['label']}; "
        f"concept: {concept_word[found['concept']]}"
    )
    lines.append(f"  resembles: {found['resembles'] or 'no shift'}")
    lines.append(f"  methods: {ranking_text(report['methods'])}")
    return "\n".join(lines)


def _covariate_line(cov: Mapping[str, Any]) -> str:
    if cov["mean_mmd"] is None:
        return "mean MMD²: n/a"
    text = f"mean MMD² over site pairs: {cov['mean_mmd']:.4f}"
    if cov["bands"] is None:
        return text + f" (no synthetic bands calibrated for {cov['task']})"
    edges = ", ".join(f"{k} < {hi:.3f}" for k, (_, hi) in cov["bands"].items() if hi is not None)
    return text + f"; covariate level {cov['level']} ({cov['task']} bands: {edges}, high above)"
