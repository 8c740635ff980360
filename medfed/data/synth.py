"""Synthetic federation: fundus and CT sites written in the same on-disk layouts as real data.

The embedded default data of the toolkit. Each site differs from the others the way hospitals
do: another camera or scanner (covariate shift) and another share of sick patients (label
shift). Two tasks; ``task="binary"`` (the default) writes, under one folder::

    ACRIMA/  RIM-ONE_DL/  REFUGE/        glaucoma sites (layouts acrima, rimone, refuge)
    CT_DICOM/  CT_NIFTI/                 liver-lesion CT sites (layouts dicom, nifti)
    sites/<id>.toml                      one manifest per site, roots relative to it
    synth_meta.json                      per-image ground truth (cup-to-disc ratio, lesion, ...)

and ``task="dr"`` a diabetic-retinopathy grading federation (ICDR grades 0-4) in the APTOS,
EyePACS and IDRiD layouts (``medfed.data.synth_dr``).

Heterogeneity scenarios: ``shift`` (a :class:`GlaucomaShift` for the glaucoma sites, a
:class:`DRShift` for DR) sets the number of sites, the covariate shift (low, mid, high), Dirichlet
label shift and concept shift (sites that label by different rules); each site's rule is written
into its manifest's ``known_shifts`` and ``synth_meta.json``.

The same seed gives byte-identical files: every image draws from its own generator seeded by
(seed, site, image), and no file embeds a time stamp. The writers live in ``synth_fundus``,
``synth_ct`` and ``synth_dr``; ``synth_common`` holds what they share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medfed.core.manifest import Modality
from medfed.data import synth_dr, synth_fundus
from medfed.data.synth_common import (
    FORMAT_VERSION,
    GENERATOR,
    MANIFEST_DIR,
    SynthesisError,
    load_synth_meta,
    prepare_folder,
    write_manifest,
    write_meta,
)
from medfed.data.synth_ct import CT_LIVER_WINDOW, CT_SITES, CTSite
from medfed.data.synth_dr import DRShift
from medfed.data.synth_fundus import FUNDUS_SITES, FundusSite, GlaucomaShift

__all__ = [
    "CT_LIVER_WINDOW",
    "CT_SITES",
    "FUNDUS_SITES",
    "SITES",
    "TASKS",
    "CTSite",
    "DRShift",
    "FundusSite",
    "GlaucomaShift",
    "SynthesisError",
    "load_synth_meta",
    "synthesize",
]

ALL = "all"
MODALITIES = (*(str(m) for m in Modality), ALL)
TASKS = ("binary", "dr")
DEFAULT_N_PER_SITE = {Modality.FUNDUS: 240, Modality.CT: 200}
MIN_N_PER_SITE = {Modality.FUNDUS: 12, Modality.CT: 4}

SITES: tuple[FundusSite | CTSite, ...] = (*FUNDUS_SITES, *CT_SITES)

# Everything any task may write, so that one task's output may replace another's.
_FOLDERS = tuple(
    dict.fromkeys((*(s.folder for s in SITES), *synth_fundus.FOLDERS, *synth_dr.FOLDERS))
)


def _manifest_names() -> list[str]:
    names = [f"{s.id}.toml" for s in SITES]
    names += synth_fundus.manifest_names() + synth_dr.manifest_names()
    return list(dict.fromkeys(names))


def synthesize(
    out: str | Path,
    modality: str = ALL,
    n_per_site: int | None = None,
    seed: int = 0,
    image_size: int | None = None,
    *,
    task: str = "binary",
    shift: DRShift | GlaucomaShift | None = None,
) -> list[Path]:
    """Write a synthetic federation under ``out``; return the manifest paths written.

    ``n_per_site``: images per fundus site and patients per CT site (defaults 240 and 200;
    for ``task="dr"`` images per site, default 240).
    ``image_size``: native height in pixels of the largest fundus camera (default 224); the
    other cameras keep their relative sizes, so the resolution shift between sites remains.
    ``task``: "binary" (glaucoma and CT lesion sites) or "dr" (ICDR grading; ``modality``
    must then be "fundus" or "all"); ``shift`` sets the sites and shifts: a
    :class:`DRShift` for task "dr", a :class:`GlaucomaShift` for the glaucoma sites of task
    "binary" (the CT sites, when written, stay as they are; without it the three hand-made
    glaucoma sites).
    ``out`` must be new, empty, or a previous output of this function (then it is replaced).
    """
    out = Path(out)
    if task not in TASKS:
        raise SynthesisError(f"task {task!r} is not one of {list(TASKS)}")
    n_of, scale = _check_arguments(modality, n_per_site, seed, image_size, task)
    dr_shift = _check_shift(shift, task, n_of)
    prepare_folder(out, _FOLDERS, _manifest_names())
    meta: dict[str, Any] = {
        "generator": GENERATOR,
        "format_version": FORMAT_VERSION,
        "complete": False,
        "seed": seed,
        "modality": modality,
        "n_per_site": {str(m): n_of.get(m, 0) for m in Modality},
        "image_size": round(224 * scale),
        "sites": {},
    }
    if task == "dr":
        meta["task"] = "dr"
    if isinstance(shift, GlaucomaShift):
        meta["shift"] = shift.to_dict()
    write_meta(out, meta)  # marks the folder as ours even if this run is interrupted
    (out / MANIFEST_DIR).mkdir()
    manifests = []
    if task == "dr":
        meta["shift"] = dr_shift.to_dict()
        for dr_site in synth_dr.plan_sites(dr_shift, seed):
            meta["sites"][dr_site.id] = dr_site.write(out, n_of[Modality.FUNDUS], seed, scale)
            manifests.append(write_manifest(out, dr_site.id, dr_site.manifest(seed, scale)))
    else:
        for site in _binary_sites(shift, seed, n_of):
            meta["sites"][site.id] = site.write(out, n_of[site.modality], seed, scale)
            manifests.append(write_manifest(out, site.id, site.manifest(seed, scale)))
    meta["complete"] = True
    write_meta(out, meta)
    return manifests


def _check_shift(
    shift: DRShift | GlaucomaShift | None, task: str, n_of: dict[Modality, int]
) -> DRShift:
    """Check ``shift`` against the task; return the DR settings (the defaults unless given)."""
    wanted = DRShift if task == "dr" else GlaucomaShift
    if shift is not None and not isinstance(shift, wanted):
        raise SynthesisError(
            f"task {task!r} takes {wanted.__name__} shift settings, not {type(shift).__name__}"
        )
    if isinstance(shift, GlaucomaShift) and Modality.FUNDUS not in n_of:
        raise SynthesisError(
            "shift settings apply to the glaucoma (fundus) sites; use modality 'fundus' or 'all'"
        )
    if shift is not None:
        shift.check()
    return shift if isinstance(shift, DRShift) else DRShift()


def _binary_sites(
    shift: DRShift | GlaucomaShift | None, seed: int, n_of: dict[Modality, int]
) -> list[FundusSite | CTSite]:
    """The sites of task "binary": the planned glaucoma sites when ``shift`` asks for them."""
    fundus: tuple[FundusSite, ...] = FUNDUS_SITES
    if isinstance(shift, GlaucomaShift):
        fundus = tuple(synth_fundus.plan_sites(shift, seed))
    return [s for s in (*fundus, *CT_SITES) if s.modality in n_of]


def _check_arguments(
    modality: str, n_per_site: int | None, seed: int, image_size: int | None, task: str
) -> tuple[dict[Modality, int], float]:
    """The number of scans per site of each chosen modality, and the fundus camera scale."""
    if modality not in MODALITIES:
        raise SynthesisError(f"modality {modality!r} is not one of {list(MODALITIES)}")
    if task == "dr" and modality == Modality.CT:
        raise SynthesisError("task 'dr' writes fundus sites; use modality 'fundus' or 'all'")
    if not isinstance(seed, int) or seed < 0:
        raise SynthesisError(f"seed must be a non-negative integer, got {seed!r}")
    chosen = tuple(Modality) if modality == ALL else (Modality(modality),)
    if task == "dr":
        chosen = (Modality.FUNDUS,)
    low = synth_dr.MIN_N_PER_SITE if task == "dr" else max(MIN_N_PER_SITE[m] for m in chosen)
    if n_per_site is not None and n_per_site < low:
        raise SynthesisError(
            f"n_per_site = {n_per_site} is too small for modality {modality!r}: every split and "
            f"class of every site needs images; use at least {low}"
        )
    if image_size is not None and not 48 <= image_size <= 2048:
        raise SynthesisError(f"image_size must be between 48 and 2048 pixels, got {image_size}")
    n_of = {m: n_per_site or DEFAULT_N_PER_SITE[m] for m in chosen}
    return n_of, (image_size or 224) / 224
