"""The ``medfed`` command line: version, registry help, and re-running a run from its config."""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed import __version__
from medfed.algorithms import ALGORITHMS, make_algorithm
from medfed.cli import app
from medfed.config import WIRE_PRECISIONS, load_run_config, merge_train_settings
from medfed.errors import ConfigError
from medfed.models.backbones import BACKBONES
from medfed.serving.routers import ROUTERS

runner = CliRunner()
# One round of one local step on two small synthetic sites: the run directory, not accuracy.
TINY = ["--rounds", "1", "--local-steps", "1", "--batch-size", "8", "--device", "cpu"]


@dataclass(frozen=True)
class TinyRun:
    base: Path
    manifests: list[Path]
    run: Path

    @property
    def config(self) -> Path:
        return self.run / "config.toml"

    def train(self, *args: str):
        """``medfed train`` with this run's cache and no progress bars."""
        extra = ["--cache-dir", str(self.base / "cache"), "--no-progress"]
        return runner.invoke(app, ["train", *args, *extra])


def read_toml(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> TinyRun:
    """A FedDRM run trained through the CLI on two synthetic fundus sites."""
    from medfed.data.synth import synthesize

    base = tmp_path_factory.mktemp("cli")
    manifests = synthesize(base / "data", "fundus", n_per_site=24, seed=1, image_size=48)[:2]
    tiny = TinyRun(base, manifests, base / "run")
    result = tiny.train("--sites", *map(str, manifests), "--algorithm", "feddrm", *TINY,
                        "--out", str(tiny.run))  # fmt: skip
    assert result.exit_code == 0, result.output
    return tiny


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"medfed {__version__}"


def help_entries(*command: str) -> dict[str, str]:
    """First word -> second word of every line of a command's help (its registry lines)."""
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    lines = [line.strip(" │").split() for line in result.output.splitlines()]
    return {words[0]: words[1] if len(words) > 1 else "" for words in lines if words}


@pytest.mark.parametrize(
    ("command", "registry"),
    [
        (("train",), {n: c.summary for n, c in ALGORITHMS.items()}),
        (("train",), dict.fromkeys(BACKBONES, "")),
        (("train",), dict.fromkeys(WIRE_PRECISIONS, "")),
        (("route",), {n: c.summary for n, c in ROUTERS.items()}),
        (("deploy", "app"), {n: c.summary for n, c in ALGORITHMS.items()}),
    ],
)
def test_help_lists_every_registered_entry_on_its_own_line(command, registry) -> None:
    entries = help_entries(*command)
    for name, summary in registry.items():
        assert name in entries, f"{' '.join(command)} --help does not list {name}"
        if summary:
            assert entries[name] == summary.split()[0], f"{name}: its summary is not on its line"


def test_feddrm_parameters_are_recorded_with_their_defaults(tiny_run) -> None:
    params = read_toml(tiny_run.config)["train"]["params"]
    defaults = make_algorithm("feddrm").params
    assert params == {f.name: getattr(defaults, f.name) for f in fields(defaults)}


def test_train_config_reruns_a_run_with_an_option_overridden(tiny_run) -> None:
    out = tiny_run.base / "rerun"
    result = tiny_run.train("--config", str(tiny_run.config), "--seed", "7", "--out", str(out))
    assert result.exit_code == 0, result.output
    before, after = read_toml(tiny_run.config), read_toml(out / "config.toml")
    assert after["train"]["seed"] == 7
    assert after["train"] == before["train"] | {"seed": 7}
    assert after["sites"] == before["sites"] and after["model"] == before["model"]
    # The same command resumes the run; other settings are refused.
    again = tiny_run.train("--config", str(tiny_run.config), "--seed", "7", "--out", str(out),
                           "--resume")  # fmt: skip
    assert again.exit_code == 0, again.output
    other = tiny_run.train("--config", str(tiny_run.config), "--out", str(out), "--resume")
    assert other.exit_code == 2 and "settings differ" in other.output


def test_train_config_rebuilds_sites_whose_manifest_files_are_gone(tiny_run) -> None:
    sites = tiny_run.manifests[0].parent
    moved = sites.with_name("sites_moved")
    out = tiny_run.base / "rebuilt"
    shutil.move(sites, moved)
    try:
        result = tiny_run.train("--config", str(tiny_run.config), "--out", str(out))
    finally:
        shutil.move(moved, sites)
    assert result.exit_code == 0, result.output
    assert read_toml(out / "config.toml")["sites"] == read_toml(tiny_run.config)["sites"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no such file"),
        ("[train\nalgorithm = 1", "not valid TOML"),
        ('[train]\nalgorithm = "feddrm"\nroundz = 3\n', "unknown setting(s) ['roundz']"),
        ("rounds = 3\n", "unknown top-level key(s) ['rounds']"),
        ('[train]\nalgorithm = "feddrm"\nrounds = "many"\n', "rounds must be an integer"),
        ("[train]\nrounds = 3\n", "no algorithm"),
    ],
)
def test_a_bad_config_file_is_refused_with_its_name(tmp_path, text, message) -> None:
    path = tmp_path / "settings.toml"
    if text is not None:
        path.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == ConfigError.exit_code == 2
    assert str(path) in result.output and message in result.output
    assert "Traceback" not in result.output


def test_a_plain_train_table_is_a_config_file(tmp_path) -> None:
    path = tmp_path / "train.toml"
    path.write_text('[train]\nalgorithm = "fedprox"\nrounds = 5\n[train.params]\nmu = 0.1\n')
    stored = load_run_config(path)
    assert stored.sites == [] and stored.train["rounds"] == 5
    config = merge_train_settings(stored.train, {"seed": 3}, where=str(path))
    assert (config.algorithm, config.rounds, config.seed, config.params) == (
        "fedprox", 5, 3, {"mu": 0.1}
    )  # fmt: skip


def test_given_params_merge_over_the_stored_ones_of_the_same_algorithm() -> None:
    stored = {"algorithm": "feddrm", "params": {"lam": 0.8, "private_norms": True}}
    merged = merge_train_settings(stored, {"params": {"lam": 0.9}}, where="f.toml")
    assert merged.params == {"lam": 0.9, "private_norms": True}
    # Another algorithm: the stored params were feddrm's, so they are dropped.
    other = merge_train_settings(stored, {"algorithm": "fedavg"}, where="f.toml")
    assert (other.algorithm, other.params) == ("fedavg", {})


def test_a_file_the_system_refuses_is_named_not_a_traceback(capsys) -> None:
    import typer

    from medfed.cli import friendly

    @friendly
    def reads() -> None:
        raise PermissionError(13, "Permission denied", "/data/site/scan.png")

    with pytest.raises(typer.Exit) as exited:
        reads()
    assert exited.value.exit_code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: /data/site/scan.png: Permission denied;")
    assert "Traceback" not in err
