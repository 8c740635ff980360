"""The ``medfed`` command line: version, registry help, and re-running a run from its config."""

from __future__ import annotations

import json
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
from medfed.core.errors import ConfigError
from medfed.models.backbones import BACKBONES
from medfed.routing.routers import ROUTERS

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
    expected = {f.name: getattr(defaults, f.name) for f in fields(defaults)}
    # client=auto is recorded as the rule the run used (no frozen encoder: the trained head)
    assert defaults.client == "auto" and params == expected | {"client": "trained"}


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


def _commands(group, path=()):
    """(name, click command) of every command and command group under ``group``."""
    for name, command in group.commands.items():
        yield " ".join((*path, name)), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_help_groups_every_command_by_what_a_user_does() -> None:
    import typer.main

    from medfed.cli.common import PANELS

    top = typer.main.get_command(app)
    panels = {
        name: getattr(command, "rich_help_panel", None) for name, command in top.commands.items()
    }
    assert not [name for name, panel in panels.items() if panel not in PANELS], panels
    assert set(panels.values()) == set(PANELS)
    text = runner.invoke(app, ["--help"], terminal_width=100).output
    headings = [text.index(f"─ {panel} ─") for panel in PANELS]
    assert headings == sorted(headings), "the groups are shown in PANELS' order"
    for name, panel in panels.items():
        after = text.index(f"─ {panel} ─")
        following = [i for i in headings if i > after]
        shown = text.index(f"│ {name} ", after)
        assert not following or shown < following[0], f"{name} is not under {panel}"


def test_each_command_help_opens_with_one_sentence_of_one_line() -> None:
    """The command lists show a help's first paragraph; a line break in it would break a
    sentence mid-line at any terminal width but the source's."""
    import typer.main

    for name, command in _commands(typer.main.get_command(app)):
        paragraphs = (command.help or "").split("\n\n")
        assert paragraphs[0] and all("\n" not in p for p in paragraphs), name
        assert len(paragraphs[0]) <= 90, f"{name}: a shorter first paragraph, details after"


def test_every_training_setting_declares_its_help_and_one_option() -> None:
    """A setting is declared once, in TrainConfig: a new one cannot go without its help and
    option (or option=None: a settings file only), and train's options come from them."""
    import typer.main

    from medfed.config import TrainConfig

    train = typer.main.get_command(app).commands["train"]
    opts = {opt: param for param in train.params for opt in param.opts}
    declared = list(fields(TrainConfig))
    assert all(spec.metadata.get("help") for spec in declared)
    assert all("option" in spec.metadata for spec in declared)
    options = [spec.metadata["option"] for spec in declared if spec.metadata["option"]]
    assert len(options) == len(set(options))
    for spec in declared:
        option = spec.metadata["option"]
        if option is None:
            continue
        param = opts[option]
        assert param.name == spec.name and param.help and "{" not in param.help, spec.name
    file_only = {spec.name for spec in declared if spec.metadata["option"] is None}
    assert file_only == {"momentum", "weight_decay", "keep_checkpoints"}


def test_a_setting_out_of_its_declared_bounds_is_refused_in_its_words() -> None:
    from medfed.config import TrainConfig

    with pytest.raises(ConfigError, match=r"rounds \(--rounds\) must be between 1 and 100000"):
        TrainConfig(algorithm="fedavg", rounds=0)
    with pytest.raises(ConfigError, match=r"^training setting: momentum must be in \[0, 1\)$"):
        TrainConfig(algorithm="fedavg", momentum=float("nan"))


def test_only_the_options_given_override_a_stored_setting() -> None:
    from medfed.cli.settings import given_settings

    given = given_settings({"rounds": None, "seed": 7, "params": ["lam=0.9"], "faults": []})
    assert given == {"seed": 7, "params": {"lam": "0.9"}}
    # an empty --init (an unset variable) is refused, not read as "random weights"
    with pytest.raises(ConfigError, match="--init is empty"):
        given_settings({"init": ""})


def test_a_mistyped_command_gets_one_suggestion() -> None:
    for argv, close in ((["site"], "'sites'"), (["sites", "chek"], "'check'")):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert result.output.count("Did you mean") == 1, result.output
        assert close in result.output


def test_train_without_a_terminal_tells_each_round(tiny_run) -> None:
    """No progress bar in a log file or a pipe: a line per round instead of silence; none with
    --no-progress."""
    out = tiny_run.base / "told"
    argv = ["train", "--sites", *map(str, tiny_run.manifests), "--algorithm", "fedavg"]
    argv += [*TINY, "--rounds", "2", "--cache-dir", str(tiny_run.base / "cache")]
    result = runner.invoke(app, [*argv, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "fedavg round 1/2, loss " in result.output
    assert "fedavg round 2/2, loss " in result.output
    quiet = runner.invoke(app, [*argv, "--out", str(tiny_run.base / "quiet"), "--no-progress"])
    assert quiet.exit_code == 0 and "round 1/2" not in quiet.output


def test_every_reader_lists_the_sites_in_the_manifests_order(tiny_run) -> None:
    """summary.json keeps its keys sorted; readers show the sites as the run lists them."""
    from medfed.runs import RunDir

    listed = [s["id"] for s in read_toml(tiny_run.config)["sites"]]
    reversed_run = tiny_run.base / "reversed"
    shutil.copytree(tiny_run.run, reversed_run)
    import tomli_w

    config = read_toml(reversed_run / "config.toml")
    config["sites"].reverse()
    (reversed_run / "config.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
    assert list(RunDir(tiny_run.run).read_summary().sites) == listed
    assert list(RunDir(reversed_run).read_summary().sites) == listed[::-1]


def test_a_whole_number_parameter_is_recorded_as_one(tmp_path, tiny_run) -> None:
    argv = ["--sites", *map(str, tiny_run.manifests), "--algorithm", "fedavgft", *TINY]
    result = tiny_run.train(*argv, "--param", "finetune_rounds=1", "--out", str(tmp_path / "ft"))
    assert result.exit_code == 0, result.output
    text = (tmp_path / "ft" / "config.toml").read_text(encoding="utf-8")
    assert "finetune_rounds = 1\n" in text
    assert read_toml(tmp_path / "ft" / "config.toml")["train"]["params"]["finetune_rounds"] == 1


def test_route_json_help_names_every_field_an_answer_has(tiny_run) -> None:
    photo = sorted(tiny_run.manifests[0].parent.parent.rglob("*.jpg"))[0]
    routed = runner.invoke(app, ["route", str(tiny_run.run), str(photo), "--json"])
    assert routed.exit_code == 0, routed.output
    fields = set(json.loads(routed.output)[0])
    shown = " ".join(runner.invoke(app, ["route", "--help"], terminal_width=2000).output.split())
    assert "audit_id" in fields and "class_probs" in fields
    missing = [f for f in sorted(fields) if f not in shown]
    assert not missing, f"route --json's help does not name {missing}"
