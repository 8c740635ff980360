"""Site policies name real algorithms and backbones; a run's backbone ``auto`` is resolved
before it is checked; ``deploy app`` merges --algorithm with --train-config; the example policy
of docs/deployment.md accepts the runs it says it allows."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.governance import names
from medfed.governance.policy import PolicyError, parse_policy

pytest.importorskip("flwr")

runner = CliRunner()
DOCS = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
SITES = ("acrima", "rimone", "refuge")


def test_the_torch_free_names_table_is_the_registries() -> None:
    from medfed.algorithms import ALGORITHMS
    from medfed.models.backbones import BACKBONES

    assert tuple(ALGORITHMS) == names.ALGORITHMS
    assert names.BACKBONES == BACKBONES


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[allow]\nbackbones = ['cnn', 'resnet18']", ("'resnet18' is no backbone", "resnet18-gn")),
        ("[allow]\nbackbones = ['auto']", ("'auto' is no backbone", "resolved")),
        ("[allow]\nalgorithms = ['FedAvg']", ("'FedAvg' is no algorithm", "fedavg")),
    ],
)
def test_a_policy_naming_what_medfed_does_not_have_is_refused(text: str, words) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "site.policy.toml")
    assert "site.policy.toml" in str(caught.value)
    for word in words:
        assert word in str(caught.value)


def _app(tmp: Path, name: str, train: str, *options: str) -> Path:
    settings = tmp / f"{name}.toml"
    settings.write_text(f"[train]\n{train}", encoding="utf-8")
    argv = ["deploy", "app", str(tmp / name), "--run-dir", "/srv/medfed/runs/x"]
    for site in SITES:
        argv += ["--site", site]
    result = runner.invoke(app, [*argv, "--train-config", str(settings), *options])
    assert result.exit_code == 0, result.output
    return tmp / name


def _check(policy: Path, run: Path, *options: str):
    argv = ["deploy", "policy", "check", str(policy), "--run", str(run), *options]
    return runner.invoke(app, argv)


def test_auto_is_checked_as_it_resolves_for_the_sites_modality(tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[allow]\nbackbones = ['resnet18-gn']\n[approval]\nrequired = false\n")
    run = _app(tmp_path, "auto", 'algorithm = "fedavg"\n')

    fundus = _check(policy, run, "--modality", "fundus")
    every = _check(policy, run)

    assert fundus.exit_code == 1, fundus.output
    assert "backbone auto resolves to cnn-gn at a fundus site" in fundus.output
    assert "refused: rule allow.backbones: the run's backbone is 'cnn-gn'" in fundus.output
    assert every.exit_code == 1 and "slices-cnn-gn" in every.output and "ct site" in every.output
    policy.write_text("[allow]\nbackbones = ['cnn-gn']\n[approval]\nrequired = false\n")
    assert _check(policy, run, "--modality", "fundus").exit_code == 0
    assert _check(policy, run, "--modality", "ct").exit_code == 1


def test_deploy_app_merges_the_command_line_over_the_settings_file(tmp_path) -> None:
    from medfed.flower.server_app import Deployment
    from medfed.governance.plan import app_run_config

    run = _app(tmp_path, "merged", "rounds = 3\nlocal_steps = 5\n", "--algorithm", "feddrm")
    over = _app(tmp_path, "over", 'algorithm = "fedavg"\nrounds = 3\n', "--rounds", "7")
    plain = _app(tmp_path, "plain", "rounds = 3\n")

    merged = Deployment.from_run_config(app_run_config(run)).plan().config
    overridden = Deployment.from_run_config(app_run_config(over)).plan().config
    default = Deployment.from_run_config(app_run_config(plain)).plan().config
    assert (merged.algorithm, merged.rounds, merged.local_steps) == ("feddrm", 3, 5)
    assert (overridden.algorithm, overridden.rounds) == ("fedavg", 7)
    assert default.algorithm == "feddrm"


def _docs_policy(starting: str) -> str:
    """The example policy of docs/deployment.md, its starting-weights placeholder filled."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Site policy, approval and audit log") :]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None, "docs/deployment.md: no ```toml policy under 'Site policy'"
    policy, filled = re.subn(r'"<sha256 of[^"]*>"', f'"{starting}"', block.group(1))
    assert filled == 1
    return policy


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [("feddrm", ""), ("fedavg", ""), ("fedavg", 'backbone = "resnet18-gn"\n')],
)
def test_the_docs_example_policy_accepts_the_runs_it_allows(tmp_path, algorithm, extra) -> None:
    from safetensors.numpy import save_file

    start = tmp_path / "start.safetensors"
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(start))
    policy = tmp_path / "acrima.policy.toml"
    policy.write_text(_docs_policy(hashlib.sha256(start.read_bytes()).hexdigest()))
    train = f'dp_epsilon = 8.0\ninit = "{start}"\nrounds = 60\nlocal_steps = 200\n{extra}'
    run = _app(tmp_path, "pilot", train, "--algorithm", algorithm, "--secure-aggregation")
    state = tmp_path / "state"
    approve = ["deploy", "approve", "--run", str(run), "--state-dir", str(state)]
    assert runner.invoke(app, approve).exit_code == 0

    options = ("--site", "acrima", "--state-dir", str(state), "--modality", "fundus")
    accepted = _check(policy, run, *options)

    assert accepted.exit_code == 0, accepted.output
    assert "accepted" in accepted.output
    plain = _app(tmp_path, "plain", f'init = "{start}"\n', "--algorithm", algorithm)
    refused = _check(policy, plain, *options)
    assert refused.exit_code == 1 and "privacy.require_dp" in refused.output
