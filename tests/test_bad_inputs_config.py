"""The bad-input corpus, settings cases: manifests, training options, run configuration files,
algorithm parameters, fault drills, and the options of synth, sites card, compare, bench, demo
and deploy (see tests/badinput.py for the policy each row is held to).

Every row fails before any training starts; rows that name sites use the shared synthetic
manifests read-only (their preprocessed scans are already in the cache).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.badinput import Case, Shared, check

UNSET = "MEDFED_TEST_SURELY_UNSET_ROOT"


# --- manifests -----------------------------------------------------------------------------------


def _manifest(text_of):
    """`sites check` on a manifest written from the first shared one by ``text_of(text, s)``;
    its root points at the shared scans (read only)."""

    def make(tmp: Path, s: Shared) -> list:
        original = s.manifests()[0]
        text = original.read_text(encoding="utf-8")
        root = (original.parent / re.search(r'^root = "(.*)"$', text, re.M)[1]).resolve()
        text = re.sub(r"^root = .*$", f'root = "{root.as_posix()}"', text, count=1, flags=re.M)
        path = tmp / "site.toml"
        made = text_of(text, s)
        if isinstance(made, bytes):
            path.write_bytes(made)
        else:
            path.write_text(made, encoding="utf-8")
        return ["sites", "check", path, "--cache-dir", tmp / "cache"]

    return make


def _replace(pattern: str, new: str):
    def edit(text: str, s: Shared) -> str:
        changed, n = re.subn(pattern, new, text, count=1, flags=re.M)
        assert n == 1, (pattern, text)
        return changed

    return edit


def _drop_labels(text: str, s: Shared) -> str:
    return re.sub(r"^\[labels\]\n(?:[a-z]+ = \d+\n)+", "", text, flags=re.M)


def _missing_manifest(tmp: Path, s: Shared) -> list:
    return ["sites", "check", tmp / "nosuch.toml"]


def _table_as(name: str, written: str):
    """Drop the manifest's ``[name]`` table and write ``written`` among its top-level fields."""

    def edit(text: str, s: Shared) -> str:
        changed, n = re.subn(rf"^\[{name}\]\n(?:[a-z_]+ = .*\n)*", "", text, flags=re.M)
        assert n == 1, (name, text)
        return f"{written}\n{changed}"

    return edit


def _ct_manifest(preprocess: str):
    """`sites check` on a CT manifest whose [preprocess] table holds ``preprocess``; it is
    refused before its (absent) scans are looked at."""

    def make(tmp: Path, s: Shared) -> list:
        text = (
            'id = "ct-site"\nmodality = "ct"\nlayout = "nifti"\nroot = "scans"\n\n'
            f"[labels]\nnormal = 0\nlesion = 1\n\n[preprocess]\n{preprocess}\n"
        )
        path = tmp / "site.toml"
        path.write_text(text, encoding="utf-8")
        return ["sites", "check", path, "--cache-dir", tmp / "cache"]

    return make


MANIFEST_CASES = [
    Case(
        "manifest is not TOML",
        _manifest(lambda text, s: 'id = "half a string\n'),
        2,
        ("site.toml", "not valid TOML"),
    ),
    Case(
        "manifest is not UTF-8",
        _manifest(lambda text, s: text.encode("utf-8").replace(b"Synthetic", b"Synth\xe9tic")),
        2,
        ("site.toml", "UTF-8"),
    ),
    Case("manifest is empty", _manifest(lambda text, s: ""), 2, ("site.toml", "empty")),
    Case(
        "manifest lacks its labels table",
        _manifest(_drop_labels),
        2,
        ("site.toml", "labels", "normal = 0"),
    ),
    Case(
        "manifest has an unknown field",
        _manifest(lambda text, s: 'colour = "red"\n' + text),
        2,
        ("site.toml", "colour", "known"),
    ),
    Case(
        "manifest names an unknown layout",
        _manifest(_replace(r'^layout = ".*"$', 'layout = "jpegdir"')),
        2,
        ("site.toml", "jpegdir", "imagefolder"),
    ),
    Case(
        "manifest root does not exist",
        _manifest(_replace(r"^root = .*$", 'root = "/nowhere/medfed/scans"')),
        2,
        ("site.toml", "/nowhere/medfed/scans", "does not exist"),
    ),
    Case(
        "manifest root uses an unset environment variable",
        _manifest(_replace(r"^root = .*$", f'root = "${UNSET}/scans"')),
        2,
        ("site.toml", UNSET, "not set"),
    ),
    Case(
        "site id holds a slash",
        _manifest(_replace(r'^id = ".*"$', 'id = "a/b"')),
        2,
        ("site.toml", "'a/b'", "names files"),
    ),
    Case(
        "site id is two dots",
        _manifest(_replace(r'^id = ".*"$', 'id = ".."')),
        2,
        ("site.toml", "'..'", "start with a letter or digit"),
    ),
    Case(
        "manifest names an unknown modality",
        _manifest(_replace(r'^modality = ".*"$', 'modality = "xray"')),
        2,
        ("site.toml", "xray", "modality"),
    ),
    Case(
        "manifest labels skip an index",
        _manifest(_replace(r"^glaucoma = 1$", "glaucoma = 2")),
        2,
        ("site.toml", "[labels]", "0..K-1"),
    ),
    Case(
        "manifest image size is text",
        _manifest(_replace(r"^image_size = .*$", 'image_size = "64"')),
        2,
        ("site.toml", "image_size", "an integer"),
    ),
    Case("manifest file does not exist", _missing_manifest, 2, ("nosuch.toml", "not found")),
    Case(
        "CT spacing is NaN",
        _ct_manifest("spacing = [nan, 4.0, 4.0]"),
        2,
        ("site.toml", "[preprocess] spacing", "finite", "between 0.05 and 50"),
    ),
    Case(
        "CT spacing is vanishingly small",
        _ct_manifest("spacing = [1e-300, 4.0, 4.0]"),
        2,
        ("site.toml", "[preprocess] spacing", "between 0.05 and 50"),
    ),
    Case(
        "CT spacing is enormous",
        _ct_manifest("spacing = [1e300, 4.0, 4.0]"),
        2,
        ("site.toml", "[preprocess] spacing", "between 0.05 and 50"),
    ),
    Case(
        "CT HU window is infinite",
        _ct_manifest("hu_window = [-inf, inf]"),
        2,
        ("site.toml", "hu_window", "finite HU", "[-160, 240]"),
    ),
    Case(
        "CT HU window is enormous",
        _ct_manifest("hu_window = [-1e308, 1e308]"),
        2,
        ("site.toml", "hu_window", "between -2000 and 5000", "[-160, 240]"),
    ),
    Case(
        "CT HU window is inverted",
        _ct_manifest("hu_window = [240, -160]"),
        2,
        ("site.toml", "hu_window", "low below high", "[-160, 240]"),
    ),
    Case(
        "CT shape is enormous",
        _ct_manifest("shape = [100000, 48, 48]"),
        2,
        ("site.toml", "[preprocess] shape", "100000", "between 4 and 1024"),
    ),
    Case(
        "CT shape holds too many voxels",
        _ct_manifest("shape = [1024, 1024, 1024]"),
        2,
        ("site.toml", "[preprocess] shape", "voxels", "67108864"),
    ),
    Case(
        "manifest preprocess is a number",
        _manifest(_table_as("preprocess", "preprocess = 5")),
        2,
        ("site.toml", "[preprocess] must be a table", "image_size = 64"),
    ),
    Case(
        "manifest preprocess is a string",
        _manifest(_table_as("preprocess", 'preprocess = "image_size"')),
        2,
        ("site.toml", "[preprocess] must be a table", "image_size = 64"),
    ),
    Case(
        "manifest preprocess is an array",
        _manifest(_table_as("preprocess", "preprocess = [1, 2]")),
        2,
        ("site.toml", "[preprocess] must be a table", "image_size = 64"),
    ),
    Case(
        "manifest preprocess is an array of tables",
        _manifest(_replace(r"^\[preprocess\]$", "[[preprocess]]")),
        2,
        ("site.toml", "[preprocess] must be a table", "array of tables"),
    ),
    Case(
        "manifest split is a number",
        _manifest(_table_as("split", "split = 3")),
        2,
        ("site.toml", "[split] must be a table", "seed = 0"),
    ),
    Case(
        "manifest split is true",
        _manifest(_table_as("split", "split = true")),
        2,
        ("site.toml", "[split] must be a table", "seed = 0"),
    ),
    Case(
        "manifest split is an array",
        _manifest(_table_as("split", 'split = ["seed"]')),
        2,
        ("site.toml", "[split] must be a table", "seed = 0"),
    ),
    Case(
        "manifest labels is an array",
        _manifest(_table_as("labels", 'labels = ["normal", "glaucoma"]')),
        2,
        ("site.toml", "[labels] must be a table", "normal = 0"),
    ),
    Case(
        "manifest layout options is a string",
        _manifest(lambda text, s: 'layout_options = "flat"\n' + text),
        2,
        ("site.toml", "[layout_options] must be a table"),
    ),
    Case(
        "manifest split seed is negative",
        _manifest(_replace(r"^seed = 0$", "seed = -5")),
        2,
        ("site.toml", "[split] seed", "integer >= 0", "-5"),
    ),
    Case(
        "site id is too long to name a file",
        _manifest(_replace(r'^id = ".*"$', f'id = "{"a" * 250}"')),
        2,
        ("site.toml", "250 characters", "at most 64"),
    ),
    Case(
        "manifest label index is true",
        _manifest(_replace(r"^glaucoma = 1$", "glaucoma = true")),
        2,
        ("site.toml", "[labels] glaucoma", "class index", "true/false"),
    ),
    Case(
        "manifest description is an array",
        _manifest(_replace(r"^description = .*$", "description = [1, 2]")),
        2,
        ("site.toml", "description", "must be a string"),
    ),
    Case(
        "manifest licence is a number",
        _manifest(_replace(r"^licence = .*$", "licence = 3")),
        2,
        ("site.toml", "licence", "must be a string"),
    ),
    Case(
        "manifest provenance is a number",
        _manifest(_replace(r"^licence = .*$", "provenance = 3")),
        2,
        ("site.toml", "provenance", "must be a string"),
    ),
    Case(
        "manifest classes_held is a string",
        _manifest(_replace(r"^licence = .*$", 'classes_held = "glaucoma"')),
        2,
        ("site.toml", "classes_held", "list of class names", "'glaucoma'"),
    ),
    Case(
        "manifest classes_held is empty",
        _manifest(_replace(r"^licence = .*$", "classes_held = []")),
        2,
        ("site.toml", "classes_held", "is empty", "leave the field out"),
    ),
    Case(
        "manifest classes_held names a class labels does not declare",
        _manifest(_replace(r"^licence = .*$", 'classes_held = ["dr"]')),
        2,
        ("site.toml", "classes_held names ['dr']", "[labels] does not declare"),
    ),
    Case(
        "manifest classes_held lists a class twice",
        _manifest(_replace(r"^licence = .*$", 'classes_held = ["normal", "normal"]')),
        2,
        ("site.toml", "classes_held", "twice"),
    ),
]


# --- training options ----------------------------------------------------------------------------


def _train(*options: str, sites: int = 2):
    """`medfed train` on the shared sites (read only) with ``options``; fails before training."""

    def make(tmp: Path, s: Shared) -> list:
        manifests = s.manifests()[:sites]
        argv = ["train", "--sites", *manifests, "--device", "cpu", "--no-progress"]
        return [*argv, "--out", tmp / "run", *options]

    return make


def _same_manifest_twice(tmp: Path, s: Shared) -> list:
    first = s.manifests()[0]
    return ["train", "--sites", first, first, "--algorithm", "fedavg", "--out", tmp / "run"]


TRAIN_CASES = [
    Case(
        "backbone made for CT volumes on fundus sites",
        _train("--algorithm", "fedavg", "--backbone", "slices-cnn-gn"),
        2,
        ("--backbone", "slices-cnn-gn", "fundus", "cnn-gn"),
    ),
    Case("rounds is zero", _train("--algorithm", "fedavg", "--rounds", "0"), 2, ("--rounds",)),
    Case(
        "latency scans set to no whole number",
        _train("--algorithm", "fedavg"),
        2,
        ("MEDFED_LATENCY_SCANS='0'", "1 or more", "unset it"),
        env=(("MEDFED_LATENCY_SCANS", "0"),),
    ),
    Case(
        "precision is not one medfed trains in",
        _train("--algorithm", "fedavg", "--precision", "fp8"),
        2,
        ("precision (--precision)", "'fp8'", "auto", "fp16"),
    ),
    Case(
        "local steps is zero",
        _train("--algorithm", "fedavg", "--local-steps", "0"),
        2,
        ("--local-steps", ">= 1"),
    ),
    Case(
        "learning rate is negative",
        _train("--algorithm", "fedavg", "--lr", "-0.1"),
        2,
        ("--lr", "> 0"),
    ),
    Case(
        "learning rate is NaN", _train("--algorithm", "fedavg", "--lr", "nan"), 2, ("--lr", "nan")
    ),
    Case(
        "learning rate is infinite",
        _train("--algorithm", "fedavg", "--lr", "inf"),
        2,
        ("--lr", "inf"),
    ),
    Case(
        "client fraction is zero",
        _train("--algorithm", "fedavg", "--client-fraction", "0"),
        2,
        ("--client-fraction", "(0, 1]"),
    ),
    Case(
        "client fraction is above one",
        _train("--algorithm", "fedavg", "--client-fraction", "1.5"),
        2,
        ("--client-fraction", "1.5"),
    ),
    Case(
        "operating point is malformed",
        _train("--algorithm", "fedavg", "--operating-point", "spec:2"),
        2,
        ("--operating-point", "spec:2", "youden"),
    ),
    Case(
        "operating point specificity is out of range",
        _train("--algorithm", "fedavg", "--operating-point", "specificity:1.5"),
        2,
        ("--operating-point", "out of range"),
    ),
    Case(
        "param lacks an equals sign",
        _train("--algorithm", "feddrm", "--param", "lam"),
        2,
        ("--param", "'lam'", "NAME=VALUE"),
    ),
    Case(
        "param lacks a value",
        _train("--algorithm", "feddrm", "--param", "lam="),
        2,
        ("--param", "NAME=VALUE"),
    ),
    Case(
        "param is given twice",
        _train("--algorithm", "feddrm", "--param", "lam=0.1", "--param", "lam=0.2"),
        2,
        ("--param", "lam", "twice"),
    ),
    Case(
        "param the algorithm does not take",
        _train("--algorithm", "fedavg", "--param", "lam=0.5"),
        2,
        ("fedavg", "lam"),
    ),
    Case(
        "param value of the wrong type",
        _train("--algorithm", "feddrm", "--param", "lam=abc"),
        2,
        ("lam", "abc"),
    ),
    Case(
        "fault drill past the last round",
        _train("--algorithm", "fedavg", "--rounds", "2", "--inject-fault", "5:acrima:nan"),
        2,
        ("--inject-fault", "5:acrima:nan", "--rounds"),
    ),
    Case(
        "fault drill in round zero",
        _train("--algorithm", "fedavg", "--rounds", "2", "--inject-fault", "0:acrima:nan"),
        2,
        ("--inject-fault", "0:acrima:nan", "outside 1..2"),
    ),
    Case(
        "fault drill of an unknown kind",
        _train("--algorithm", "fedavg", "--inject-fault", "1:acrima:boom"),
        2,
        ("--inject-fault", "1:acrima:boom", "ROUND:SITE:KIND"),
    ),
    Case(
        "fault drill without a site",
        _train("--algorithm", "fedavg", "--inject-fault", "1::nan"),
        2,
        ("--inject-fault", "1::nan"),
    ),
    Case(
        "two fault drills for one site and round",
        _train(
            "--algorithm",
            "fedavg",
            "--rounds",
            "2",
            "--inject-fault",
            "1:acrima:nan",
            "--inject-fault",
            "1:acrima:drop",
        ),  # fmt: skip
        2,
        ("--inject-fault", "1:acrima:nan", "1:acrima:drop"),
    ),
    Case(
        "fault drill with sampled sites may never fire",
        _train(
            "--algorithm",
            "fedavg",
            "--rounds",
            "2",
            "--client-fraction",
            "0.5",
            "--inject-fault",
            "1:acrima:drop",
        ),  # fmt: skip
        2,
        ("--inject-fault", "--client-fraction", "never fire"),
    ),
    Case(
        "fault drill names a site not in the federation",
        _train("--algorithm", "fedavg", "--rounds", "2", "--inject-fault", "1:nosuch:drop"),
        2,
        ("fault", "nosuch"),
    ),
    Case(
        "a corrupted-update drill for an algorithm that sends no update",
        _train("--algorithm", "local", "--rounds", "2", "--inject-fault", "1:acrima:nan"),
        2,
        ("1:acrima:nan", "sends no update", "raise, timeout or drop"),
    ),
    Case("the same manifest given twice", _same_manifest_twice, 2, ("acrima.toml", "twice")),
    Case("unknown algorithm", _train("--algorithm", "fedfoo"), 2, ("fedfoo", "algorithm")),
    Case("no algorithm", _train(), 2, ("--algorithm",)),
    Case("mistyped option", lambda tmp, s: ["train", "--bogus"], 2, ("--bogus",)),
    Case(
        "rounds too large for a counter",
        _train("--algorithm", "fedavg", "--rounds", "99999999999999999999"),
        2,
        ("--rounds", "between 1 and 100000"),
    ),
    Case(
        "rounds that would run for years",
        _train("--algorithm", "fedavg", "--rounds", "100000000"),
        2,
        ("--rounds", "100000000", "between 1 and 100000"),
    ),
    Case(
        "local steps that would run for years",
        _train("--algorithm", "fedavg", "--local-steps", "1000000000000"),
        2,
        ("--local-steps", "at most 1000000"),
    ),
    Case(
        "batch size beyond any memory",
        _train("--algorithm", "fedavg", "--batch-size", "10000000"),
        2,
        ("--batch-size", "at most 65536"),
    ),
    Case(
        "train into an empty --out",
        _train("--algorithm", "fedavg", "--out", ""),
        2,
        ("--out", "is empty"),
    ),
    Case(
        "train with an empty --cache-dir",
        _train("--algorithm", "fedavg", "--cache-dir", ""),
        2,
        ("--cache-dir", "is empty"),
    ),
    Case(
        "concurrency is negative",
        _train("--algorithm", "fedavg", "--concurrency", "-1"),
        2,
        ("--concurrency", "0 (auto)", "got -1"),
    ),
    Case(
        "privacy budget is negative",
        _train("--algorithm", "fedavg", "--dp-epsilon", "-1"),
        2,
        ("--dp-epsilon", "> 0"),
    ),
    Case(
        "privacy budget is NaN",
        _train("--algorithm", "fedavg", "--dp-epsilon", "nan"),
        2,
        ("--dp-epsilon", "nan"),
    ),
    Case(
        "privacy clip is zero",
        _train("--algorithm", "fedavg", "--dp-epsilon", "3", "--dp-clip", "0"),
        2,
        ("--dp-clip", "> 0"),
    ),
    Case(
        "privacy delta of one",
        _train("--algorithm", "fedavg", "--dp-epsilon", "3", "--dp-delta", "1"),
        2,
        ("--dp-delta", "(0, 1)"),
    ),
    Case(
        "privacy delta without a budget or noise",
        _train("--algorithm", "fedavg", "--dp-delta", "1e-5"),
        2,
        ("--dp-epsilon", "--dp-noise", "not differentially private"),
    ),
    Case(
        "privacy accountant unknown",
        _train("--algorithm", "fedavg", "--dp-epsilon", "3", "--dp-accountant", "gdp"),
        2,
        ("dp_accountant", "rdp", "prv", "gdp"),
    ),
    Case(
        "privacy noise that spends the budget in the first round",
        _train("--algorithm", "fedavg", "--dp-epsilon", "1", "--dp-noise", "0.3"),
        2,
        ("first round", "--dp-noise", "--dp-epsilon 1"),
    ),
    Case(
        "privacy with a BatchNorm backbone",
        _train("--algorithm", "fedavg", "--dp-epsilon", "3", "--backbone", "cnn"),
        2,
        ("differential privacy", "'cnn'", "BatchNorm", "--backbone cnn-gn"),
    ),
    Case(
        "privacy with an algorithm that has no per-scan gradient",
        _train("--algorithm", "fedprox", "--dp-epsilon", "3"),
        2,
        ("fedprox", "differential privacy", "proximal", "feddrm"),
    ),
]


# --- run configuration files ---------------------------------------------------------------------


def _run_config(text_of):
    """`medfed train --config` on a config.toml written by ``text_of(the shared run's text)``."""

    def make(tmp: Path, s: Shared) -> list:
        text = (s.run / "config.toml").read_text(encoding="utf-8")
        made = text_of(text)
        path = tmp / "config.toml"
        if isinstance(made, bytes):
            path.write_bytes(made)
        else:
            path.write_text(made, encoding="utf-8")
        return ["train", "--config", path, "--out", tmp / "run", "--no-progress"]

    return make


CONFIG_CASES = [
    Case(
        "run config.toml is cut short",
        _run_config(lambda text: text.split('algorithm = "')[0] + 'algorithm = "fed'),
        2,
        ("config.toml", "not valid TOML"),
    ),
    Case(
        "run config.toml is not UTF-8",
        _run_config(lambda text: b"\xff\xfe" + text.encode("utf-16-le")),
        2,
        ("config.toml", "UTF-8"),
    ),
    Case(
        "run config.toml learning rate is text",
        _run_config(lambda text: re.sub(r"^lr = .*$", 'lr = "fast"', text, count=1, flags=re.M)),
        2,
        ("config.toml", "lr", "a number"),
    ),
    Case(
        "run config.toml compile is text",
        _run_config(
            lambda text: re.sub(r"^compile = .*$", 'compile = "yes"', text, count=1, flags=re.M)
        ),
        2,
        ("config.toml", "compile", "true or false"),
    ),
    Case(
        "run config.toml has an unknown setting",
        _run_config(lambda text: text.replace("[train]\n", "[train]\nroundz = 3\n", 1)),
        2,
        ("config.toml", "roundz"),
    ),
    Case(
        "run config.toml fault drill past the last round",
        _run_config(
            lambda text: re.sub(
                r"^faults = .*$", 'faults = ["99:acrima:nan"]', text, count=1, flags=re.M
            )
        ),
        2,
        ("config.toml", "99:acrima:nan", "--rounds"),
    ),
    Case(
        "run config.toml from a newer medfed",
        _run_config(
            lambda text: re.sub(r"^schema_version = .*$", "schema_version = 99", text, flags=re.M)
        ),
        2,
        ("config.toml", "schema_version 99", "upgrade medfed"),
    ),
    Case(
        "run config.toml does not exist",
        lambda tmp, s: ["train", "--config", tmp / "config.toml", "--out", tmp / "run"],
        2,
        ("config.toml", "no such file"),
    ),
]


# --- synth, sites card, compare, bench, demo -----------------------------------------------------


def _existing_file(tmp: Path, s: Shared) -> list:
    (tmp / "taken.txt").write_text("not a folder\n", encoding="utf-8")
    return ["synth", "--out", tmp / "taken.txt", "--modality", "fundus"]


def _card_duplicate(tmp: Path, s: Shared) -> list:
    first = s.manifests()[0]
    return ["sites", "card", first, "--other", first, "--out-dir", tmp / "cards"]


def _card_into_file(tmp: Path, s: Shared) -> list:
    (tmp / "cards").write_text("a file\n", encoding="utf-8")
    return ["sites", "card", s.manifests()[0], "--out-dir", tmp / "cards"]


def _card_with_unusable_other(tmp: Path, s: Shared) -> list:
    (tmp / "other.toml").write_text('id = "other"\n', encoding="utf-8")
    first = s.manifests()[0]
    return ["sites", "card", first, "--other", tmp / "other.toml", "--out-dir", tmp / "cards"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _readme_without_markers(command: str):
    def make(tmp: Path, s: Shared) -> list:
        readme = tmp / "README.md"
        readme.write_text("# A project\n\nNo tables here.\n", encoding="utf-8")
        return [command, "--out", tmp / "out", "--update-readme", readme]

    return make


def _fundus_demo_readme_only(tmp: Path, s: Shared) -> list:
    readme = tmp / "README.md"
    readme.write_text("<!-- demo-table:start -->\n<!-- demo-table:end -->\n", encoding="utf-8")
    return ["demo", "--out", tmp / "d", "--modality", "ct", "--update-readme", readme]


OTHER_CASES = [
    Case("synth into an existing file", _existing_file, 2, ("taken.txt", "is a file")),
    Case(
        "synth into an empty --out",
        lambda tmp, s: ["synth", "--out", "", "--modality", "fundus"],
        2,
        ("--out", "is empty"),
    ),
    Case(
        "demo into an empty --out",
        lambda tmp, s: ["demo", "--out", ""],
        2,
        ("--out", "is empty"),
    ),
    Case(
        "compare into the current folder",
        lambda tmp, s: ["compare", "--out", "."],
        2,
        ("--out", "'.'"),
    ),
    Case(
        "bench into an empty --out",
        lambda tmp, s: ["bench", "--out", ""],
        2,
        ("--out", "is empty"),
    ),
    Case(
        "synth with zero scans per site",
        lambda tmp, s: ["synth", "--out", tmp / "s", "--modality", "fundus", "--n-per-site", "0"],
        2,
        ("n_per_site", "at least"),
    ),
    Case(
        "synth of an unknown modality",
        lambda tmp, s: ["synth", "--out", tmp / "s", "--modality", "xray"],
        2,
        ("xray", "modality"),
    ),
    Case(
        "sites card with the same site as --other",
        _card_duplicate,
        2,
        ("acrima", "--other"),
    ),
    Case("sites card into a file", _card_into_file, 2, ("--out-dir", "cards", "is a file")),
    Case(
        "compare an unknown method",
        lambda tmp, s: ["compare", "--method", "fedfoo", "--out", tmp / "c"],
        2,
        ("--method", "fedfoo"),
    ),
    Case(
        "compare a method with a parameter it does not take",
        lambda tmp, s: ["compare", "--method", "fedavg:lam=0.5", "--out", tmp / "c"],
        2,
        ("--method", "fedavg:lam=0.5", "lam"),
    ),
    Case(
        "compare a method with an unknown wire precision",
        lambda tmp, s: ["compare", "--method", "fedavg@int4", "--out", tmp / "c"],
        2,
        ("--method", "fedavg@int4", "wire_precision"),
    ),
    Case(
        "compare the same method twice",
        lambda tmp, s: ["compare", "--method", "fedavg", "--method", "fedavg", "--out", tmp],
        2,
        ("--method", "fedavg", "same method"),
    ),
    Case(
        "compare with a reference that does not run",
        lambda tmp, s: ["compare", "--method", "fedavg", "--reference", "feddrm", "--out", tmp],
        2,
        ("feddrm", "reference"),
    ),
    Case(
        "compare into a README without its section",
        _readme_without_markers("compare"),
        2,
        ("--update-readme", "README.md", "compare-table:start"),
    ),
    Case(
        "demo of an unknown modality",
        lambda tmp, s: ["demo", "--out", tmp / "d", "--modality", "xray"],
        2,
        ("--modality", "xray", "fundus, ct, all"),
    ),
    Case(
        "CT demo into a README without the CT demo section",
        _fundus_demo_readme_only,
        2,
        ("--update-readme", "demo-ct-table:start"),
    ),
    Case(
        "demo into a README that does not exist",
        lambda tmp, s: ["demo", "--out", tmp / "d", "--update-readme", tmp / "NOPE.md"],
        2,
        ("--update-readme", "NOPE.md", "no such file"),
    ),
    Case(
        "bench into a README without its section",
        _readme_without_markers("bench"),
        2,
        ("--update-readme", "bench-table:start"),
    ),
    Case(
        "bench of the CT federation into a README with only the two-federation section",
        lambda tmp, s: [
            "bench",
            "--modality",
            "ct",
            "--out",
            tmp / "b",
            "--update-readme",
            _write(tmp / "README.md", "<!-- bench-table:start -->\n<!-- bench-table:end -->\n"),
        ],
        2,
        ("--update-readme", "bench-ct-table:start"),
    ),
    Case(
        "bench of an unknown method",
        lambda tmp, s: ["bench", "--method", "fedavg", "--method", "nosuch", "--out", tmp / "b"],
        2,
        ("--method", "'nosuch'", "unknown algorithm"),
    ),
    Case(
        "bench without fedavg",
        lambda tmp, s: ["bench", "--method", "feddrm", "--out", tmp / "b"],
        2,
        ("--method", "needs fedavg"),
    ),
    Case(
        "bench of one method given twice",
        lambda tmp, s: ["bench", "--method", "fedavg", "--method", "fedavg", "--out", tmp / "b"],
        2,
        ("--method", "once"),
    ),
    Case(
        "bench with zero seeds",
        lambda tmp, s: ["bench", "--seeds", "0", "--out", tmp / "b"],
        2,
        ("--seeds",),
    ),
    Case(
        "bench measuring the memory of a CT site too small to split",
        lambda tmp, s: ["bench", "--memory-patients", "3", "--out", tmp / "b"],
        2,
        ("--memory-patients", "at least 4"),
    ),
    Case(
        "bench of an unknown modality",
        lambda tmp, s: ["bench", "--modality", "xray", "--out", tmp / "b"],
        2,
        ("--modality", "xray"),
    ),
    Case(
        "scenarios of an unknown ablation",
        lambda tmp, s: ["scenarios", "--ablation", "altitude", "--out", tmp / "sc"],
        2,
        ("--ablation", "'altitude'", "covariate"),
    ),
    Case(
        "scenarios with a method the ablation does not train",
        lambda tmp, s: [
            "scenarios",
            "--ablation",
            "label",
            "--method",
            "lora",
            "--out",
            tmp / "sc",
        ],
        2,
        ("--method", "'lora'", "label ablation"),
    ),
    Case(
        "scenarios at a level the ablation does not have",
        lambda tmp, s: [
            "scenarios",
            "--ablation",
            "covariate",
            "--level",
            "x",
            "--out",
            tmp / "sc",
        ],
        2,
        ("--level", "'x'", "low"),
    ),
    Case(
        "scenarios into a page without its section",
        lambda tmp, s: [
            "scenarios",
            "--ablation",
            "concept",
            "--out",
            tmp / "sc",
            "--update-readme",
            _write(tmp / "page.md", "<!-- scenario-label:start -->\n<!-- scenario-label:end -->\n"),
        ],
        2,
        ("--update-readme", "scenario-concept:start"),
    ),
    Case(
        "dashboard on port zero",
        lambda tmp, s: ["dashboard", "--port", "0"],
        2,
        ("--port",),
    ),
    Case(
        "dashboard --metrics-port is its own --port",
        lambda tmp, s: ["dashboard", tmp, "--port", "8600", "--metrics-port", "8600"],
        2,
        ("--metrics-port 8600", "another port"),
    ),
    Case(
        "dashboard --log-format is neither text nor json",
        lambda tmp, s: ["dashboard", tmp, "--log-format", "xml"],
        2,
        ("--log-format", "'xml'", "text or json"),
    ),
    Case(
        "dashboard --metrics-host is no IP address",
        lambda tmp, s: ["dashboard", tmp, "--metrics-port", "9102", "--metrics-host", "here"],
        2,
        ("--metrics-host", "'here'", "not an IP address"),
    ),
]


# --- deploy --------------------------------------------------------------------------------------


def _deploy(*options: str, train_toml: str | bytes | None = None, out: str = "app"):
    def make(tmp: Path, s: Shared) -> list:
        argv = ["deploy", "app", tmp / out, "--site", "acrima", "--site", "rimone"]
        argv += ["--run-dir", tmp / "run", *options]
        if train_toml is not None:
            path = tmp / "train.toml"
            if isinstance(train_toml, bytes):
                path.write_bytes(train_toml)
            else:
                path.write_text(train_toml, encoding="utf-8")
            argv += ["--train-config", path]
        return argv

    return make


def _deploy_into_file(tmp: Path, s: Shared) -> list:
    (tmp / "app").write_text("a file\n", encoding="utf-8")
    return _deploy()(tmp, s)


def _deploy_over_project(tmp: Path, s: Shared) -> list:
    (tmp / "app").mkdir()
    (tmp / "app" / "pyproject.toml").write_text('[project]\nname = "mine"\n', encoding="utf-8")
    return _deploy()(tmp, s)


def _pki_over_pki(tmp: Path, s: Shared) -> list:
    (tmp / "pki").mkdir()
    (tmp / "pki" / "ca.key").write_text("an existing key\n", encoding="utf-8")
    return ["deploy", "pki", tmp / "pki", "--host", "127.0.0.1", "--site", "acrima"]


DEPLOY_CASES = [
    Case("deploy app into an existing file", _deploy_into_file, 2, ("app", "is a file")),
    Case(
        "deploy app over another project",
        _deploy_over_project,
        2,
        ("pyproject.toml", "not a medfed app"),
    ),
    Case(
        "deploy app with a corrupting drill on an algorithm that sends nothing",
        _deploy(
            "--algorithm",
            "local",
            train_toml='[train]\nalgorithm = "local"\nrounds = 2\nfaults = ["1:acrima:nan"]\n',
        ),  # fmt: skip
        2,
        ("train.toml", "faults", "1:acrima:nan", "local", "sends no update"),
    ),
    Case(
        "deploy app with a drill on a site it does not list",
        _deploy(
            train_toml='[train]\nalgorithm = "fedavg"\nrounds = 2\nfaults = ["1:nosuch:drop"]\n'
        ),
        2,
        ("train.toml", "1:nosuch:drop", "not in the federation"),
    ),
    Case("deploy app waiting no time", _deploy("--wait", "0"), 2, ("--wait", "> 0")),
    Case(
        "deploy app settings file is not UTF-8",
        _deploy(train_toml=b'[train]\nalgorithm = "fed\xe9avg"\n'),
        2,
        ("--train-config", "train.toml", "UTF-8"),
    ),
    Case(
        "deploy app with a malformed param",
        _deploy("--param", "lam"),
        2,
        ("--param", "NAME=VALUE"),
    ),
    Case("deploy app with zero rounds", _deploy("--rounds", "0"), 2, ("--rounds",)),
    Case("deploy pki over an existing pki", _pki_over_pki, 2, ("ca.key", "already exists")),
    Case(
        "deploy pki valid for zero days",
        lambda tmp, s: ["deploy", "pki", tmp / "p", "--host", "h", "--site", "a", "--days", "0"],
        2,
        ("--days",),
    ),
]

CASES = MANIFEST_CASES + TRAIN_CASES + CONFIG_CASES + OTHER_CASES + DEPLOY_CASES


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)


def test_the_corpus_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_the_command_line_imports_no_heavy_module() -> None:
    """A mistyped option is answered at once: importing medfed.cli leaves torch, scipy,
    scikit-learn and statsmodels unimported (they load only when a command needs them)."""
    heavy = ("torch", "scipy", "sklearn", "statsmodels")
    code = f"import sys, medfed.cli\nprint(','.join(m for m in {heavy!r} if m in sys.modules))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"medfed.cli imports {result.stdout.strip()}"


def test_the_default_operating_rule_is_the_metrics_one() -> None:
    from medfed import config, metrics

    assert config.DEFAULT_OPERATING_RULE == metrics.DEFAULT_OPERATING_RULE


def test_every_option_and_argument_of_a_command_has_help() -> None:
    import typer.main

    from medfed.cli import app

    def commands(group, path=()):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from commands(command, (*path, name))
            else:
                yield " ".join((*path, name)), command

    missing = [
        f"{name} {param.name}"
        for name, command in commands(typer.main.get_command(app))
        for param in command.params
        if not getattr(param, "hidden", False) and not getattr(param, "help", None)
    ]
    assert not missing, missing


def test_a_card_shows_what_sites_check_shows(tmp_path, shared: Shared) -> None:
    """The same counts (classes in label order), distances (in the order the sites were
    given) and warnings as `medfed sites check` on the same sites."""
    import json

    from typer.testing import CliRunner

    from medfed.cli import app

    first, *others = shared.manifests()
    others = others[::-1]  # not alphabetical: the card keeps the order given
    cache = ["--cache-dir", str(tmp_path / "cache")]
    runner = CliRunner()
    checked = runner.invoke(app, ["sites", "check", "--json", *map(str, [first, *others]), *cache])
    report = json.loads(checked.stdout)[0]
    argv = ["sites", "card", str(first), "--out-dir", str(tmp_path / "cards"), *cache]
    for other in others:
        argv += ["--other", str(other)]
    made = runner.invoke(app, argv)
    assert made.exit_code == 0, made.output
    card = (tmp_path / "cards" / f"{report['site']}.md").read_text(encoding="utf-8")

    names = list(report["counts"]["train"])
    assert f"| split | {' | '.join(names)} | total |" in card
    for split, per in report["counts"].items():
        row = [per[n] for n in names]
        assert f"| {split} | {' | '.join(map(str, row))} | {sum(row)} |" in card
    assert f"| scans | {report['n_records']} listed, {report['n_readable']} readable |" in card
    lines = [f"- {site}: {d:.4f}" for site, d in report["distances"].items()]
    assert list(report["distances"]) == [json.loads(checked.stdout)[i]["site"] for i in (1, 2)]
    assert "\n".join(lines) in card
    assert report["warnings"] and all(f"- {w}" in card for w in report["warnings"])


def test_a_card_says_which_other_site_it_leaves_out(tmp_path, shared: Shared) -> None:
    """Not a corpus row (it checks a whole site): an unusable --other is named, not skipped."""
    from typer.testing import CliRunner

    from medfed.cli import app

    argv = _card_with_unusable_other(tmp_path, shared)
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exit_code == 0, result.output
    words = ("warning", "other.toml", "left out of the distance section", "missing required field")
    assert all(w in result.output for w in words), result.output
    assert (tmp_path / "cards" / "acrima.md").is_file()
