"""The bad-input corpus, `medfed deploy app`, `medfed deploy pki`, `medfed deploy worker`,
`medfed deploy policy check` and `medfed bench-deploy` cases (see tests/badinput.py for the
policy). None of these rows trains or starts a Flower process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.badinput import Case, Shared, check

pytest.importorskip("cryptography")
pytest.importorskip("flwr")

# A place no user can make a folder in: /proc takes no new entries.
UNWRITABLE = Path("/proc/medfed-out")


def _pki(*options: str, out: str | Path = "pki", hosts=("link.example.org",), sites=("acrima",)):
    def make(tmp: Path, s: Shared) -> list:
        argv: list = ["deploy", "pki", out if isinstance(out, Path) or not out else tmp / out]
        for host in hosts:
            argv += ["--host", host]
        for site in sites:
            argv += ["--site", site]
        return argv + list(options)

    return make


def _app(*options: str, out: str | Path = "app", sites=("acrima", "rimone"), run_dir=None):
    def make(tmp: Path, s: Shared) -> list:
        argv: list = ["deploy", "app", out if isinstance(out, Path) or not out else tmp / out]
        for site in sites:
            argv += ["--site", site]
        argv += ["--run-dir", tmp / "run" if run_dir is None else run_dir]
        return argv + list(options)

    return make


def _pki_into_file(tmp: Path, s: Shared) -> list:
    (tmp / "pki").write_text("a file\n", encoding="utf-8")
    return _pki()(tmp, s)


def _app_settings_folder(tmp: Path, s: Shared) -> list:
    (tmp / "train.toml").mkdir()
    return _app("--train-config", str(tmp / "train.toml"))(tmp, s)


def _train_file(tmp: Path, text: str = 'algorithm = "fedavg"\nwire_precision = "int8"\n') -> str:
    path = tmp / "train.toml"
    path.write_text(f"[train]\n{text}", encoding="utf-8")
    return str(path)


def _policy_check(policy: str, *options: str):
    """``deploy policy check`` of a policy holding ``policy`` against a fedavg app (auto)."""

    def make(tmp: Path, s: Shared) -> list:
        from medfed.config import TrainConfig
        from medfed.flower.deploy import write_app

        write_app(tmp / "app", TrainConfig(algorithm="fedavg"), ["acrima", "rimone"], "/srv/r")
        (tmp / "policy.toml").write_text(policy, encoding="utf-8")
        return ["deploy", "policy", "check", tmp / "policy.toml", "--run", tmp / "app", *options]

    return make


def _bare_train(tmp: Path) -> str:
    path = tmp / "train.toml"
    path.write_text("train = 3\n", encoding="utf-8")
    return str(path)


def _worker_on_a_file(tmp: Path, s: Shared) -> list:
    (tmp / "w.sock").write_text("a file\n", encoding="utf-8")
    return ["deploy", "worker", tmp / "w.sock"]


def _worker_under_a_file(tmp: Path, s: Shared) -> list:
    (tmp / "plain").write_text("a file\n", encoding="utf-8")
    return ["deploy", "worker", tmp / "plain" / "w.sock"]


def _worker_in_a_shared_folder(tmp: Path, s: Shared) -> list:
    (tmp / "shared").mkdir()
    (tmp / "shared").chmod(0o777)
    return ["deploy", "worker", tmp / "shared" / "w.sock"]


LONG_LABEL = "a" * 70

CASES = [
    # --- deploy pki: the names the certificates carry --------------------------------------
    Case("deploy pki with an empty host", _pki(hosts=("",)), 2, ("--host", "empty")),
    Case(
        "deploy pki with a host name of 70 characters in one part",
        _pki(hosts=(LONG_LABEL,)),
        2,
        ("--host", LONG_LABEL, "1 to 63"),
    ),
    Case(
        "deploy pki with a host that has a space and a slash",
        _pki(hosts=("a b/c",)),
        2,
        ("--host", "a b/c", "not an IP address nor a DNS name"),
    ),
    Case(
        "deploy pki with a mistyped IP address",
        _pki(hosts=("999.1.1.1",)),
        2,
        ("--host", "999.1.1.1", "not a valid IP address"),
    ),
    Case(
        "deploy pki with an IPv6 address and its zone",
        _pki(hosts=("fe80::1%eth0",)),
        2,
        ("--host", "fe80::1%eth0", "zone"),
    ),
    Case(
        "deploy pki with a host name of 300 characters",
        _pki(hosts=(".".join(["a" * 60] * 5),)),
        2,
        ("--host", "at most 253"),
    ),
    Case(
        "deploy pki with the same host twice",
        _pki(hosts=("link.example.org", "link.example.org")),
        2,
        ("--host", "link.example.org", "twice"),
    ),
    Case(
        "deploy pki with a site id that is a path",
        _pki(sites=("../x",)),
        2,
        ("--site", "../x", "letters, digits"),
    ),
    Case(
        "deploy pki with a site id of 100 characters",
        _pki(sites=("s" * 100,)),
        2,
        ("--site", "1 to 64"),
    ),
    Case("deploy pki with an empty site id", _pki(sites=("",)), 2, ("--site", "''")),
    Case(
        "deploy pki with the same site twice",
        _pki(sites=("acrima", "acrima")),
        2,
        ("--site", "acrima", "twice"),
    ),
    # --- deploy pki: validity and folder -----------------------------------------------------
    Case(
        "deploy pki valid for a hundred million days",
        _pki("--days", "100000000"),
        2,
        ("--days", "36500", "100000000"),
    ),
    Case("deploy pki valid for minus one day", _pki("--days", "-1"), 2, ("--days", "1 to 36500")),
    Case(
        "deploy pki into a folder that cannot be made",
        _pki(out=UNWRITABLE),
        2,
        ("OUT", str(UNWRITABLE), "cannot be written"),
    ),
    Case("deploy pki into an existing file", _pki_into_file, 2, ("PKI folder", "is a file")),
    Case("deploy pki into an empty folder name", _pki(out=""), 2, ("OUT", "empty")),
    # --- deploy app ---------------------------------------------------------------------------
    Case(
        "deploy app into a folder that cannot be made",
        _app(out=UNWRITABLE),
        2,
        ("OUT", str(UNWRITABLE), "cannot be written"),
    ),
    Case("deploy app into an empty folder name", _app(out=""), 2, ("OUT", "empty")),
    Case("deploy app with an empty run directory", _app(run_dir=""), 2, ("--run-dir", "empty")),
    Case("deploy app with a blank run directory", _app(run_dir="  "), 2, ("--run-dir", "empty")),
    Case(
        "deploy app with a run directory that names no run",
        _app(run_dir="/"),
        2,
        ("--run-dir", "'/'", "folder name"),
    ),
    Case(
        "deploy app waiting longer than a week",
        _app("--wait", "1e300"),
        2,
        ("--wait", "a week"),
    ),
    Case("deploy app waiting NaN seconds", _app("--wait", "nan"), 2, ("--wait", "nan")),
    Case(
        "deploy app with a reply timeout longer than a week",
        _app("--reply-timeout", "inf"),
        2,
        ("--reply-timeout", "a week"),
    ),
    Case("deploy app with an empty site id", _app(sites=("",)), 2, ("--site", "''")),
    Case(
        "deploy app with a site id with a space",
        _app(sites=("acrima", "rim one")),
        2,
        ("--site", "rim one"),
    ),
    Case(
        "deploy app with the same site twice",
        _app(sites=("acrima", "acrima")),
        2,
        ("--site", "acrima", "twice"),
    ),
    Case(
        "deploy app with an empty algorithm",
        _app("--algorithm", ""),
        2,
        ("--algorithm", "empty"),
    ),
    Case(
        "deploy app with a settings folder instead of a file",
        _app_settings_folder,
        2,
        ("--train-config", "train.toml", "is a folder"),
    ),
    Case(
        "deploy app with a settings file that is missing",
        lambda tmp, s: _app("--train-config", str(tmp / "nosuch.toml"))(tmp, s),
        2,
        ("--train-config", "nosuch.toml", "no such file"),
    ),
    Case(
        "deploy app with a settings file that is not TOML",
        lambda tmp, s: _app("--train-config", _train_file(tmp, "rounds = \n"))(tmp, s),
        2,
        ("--train-config", "train.toml", "not valid TOML"),
    ),
    Case(
        "deploy app with a settings file whose train is no table",
        lambda tmp, s: _app("--algorithm", "feddrm", "--train-config", _bare_train(tmp))(tmp, s),
        2,
        ("--train-config", "'train' must be a [train] table"),
    ),
    Case(
        "deploy app with a settings file holding an unknown setting",
        lambda tmp, s: _app(
            "--algorithm", "feddrm", "--train-config", _train_file(tmp, "roundz = 3\n")
        )(tmp, s),
        2,
        ("train.toml", "unknown training setting", "roundz"),
    ),
    # --- deploy policy check: the policy's names and --modality ------------------------------
    Case(
        "policy check with a backbone name medfed does not have",
        _policy_check("[allow]\nbackbones = ['resnet18']\n"),
        2,
        ("policy.toml", "allow.backbones", "'resnet18' is no backbone", "resnet18-gn"),
    ),
    Case(
        "policy check with auto among the allowed backbones",
        _policy_check("[allow]\nbackbones = ['auto']\n"),
        2,
        ("allow.backbones", "'auto' is no backbone", "resolved"),
    ),
    Case(
        "policy check with an algorithm name medfed does not have",
        _policy_check("[allow]\nalgorithms = ['fedadam']\n"),
        2,
        ("allow.algorithms", "'fedadam' is no algorithm", "fedavg"),
    ),
    Case(
        "policy check with an unknown modality",
        _policy_check("[approval]\nrequired = false\n", "--modality", "mri"),
        2,
        ("--modality", "'mri'", "fundus, ct"),
    ),
    # --- deploy app --secure-aggregation: settings SecAgg+ cannot run ------------------------
    Case(
        "deploy app with secure aggregation of one site",
        _app("--secure-aggregation", sites=("acrima",)),
        2,
        ("--secure-aggregation", "at least 2 sites"),
    ),
    Case(
        "deploy app with secure aggregation of two sites, not accepted",
        _app("--secure-aggregation"),
        2,
        (
            "--secure-aggregation",
            "only 2 sites",
            "recover the other's update",
            "--secure-aggregation-two-sites",
        ),
    ),
    Case(
        "deploy app accepting two sites without secure aggregation",
        _app("--secure-aggregation-two-sites"),
        2,
        ("--secure-aggregation-two-sites", "add --secure-aggregation"),
    ),
    Case(
        "deploy app with secure aggregation of lora",
        # (a federated base: LoRA on random weights is refused before, as train refuses it)
        _app("--secure-aggregation", "--algorithm", "lora", "--param", "base=federated"),
        2,
        ("--secure-aggregation", "lora", "feature statistics"),
    ),
    Case(
        "deploy app with secure aggregation of local training",
        _app("--secure-aggregation", "--algorithm", "local"),
        2,
        ("--secure-aggregation", "nothing to aggregate"),
    ),
    Case(
        "deploy app with secure aggregation of int8 updates",
        lambda tmp, s: _app("--secure-aggregation", "--train-config", _train_file(tmp))(tmp, s),
        2,
        ("--secure-aggregation", "int8", "float32 wire"),
    ),
    Case(
        "deploy app with secure aggregation sampling one site a round",
        lambda tmp, s: _app(
            "--secure-aggregation",
            "--train-config",
            _train_file(tmp, 'algorithm = "fedavg"\nclient_fraction = 0.3\n'),
            sites=("acrima", "rimone", "refuge"),
        )(tmp, s),
        2,
        ("--secure-aggregation", "samples 1", "--min-sites to 2"),
    ),
    Case(
        "deploy app with a secure bound of zero",
        _app("--secure-aggregation", "--secure-bound", "0"),
        2,
        ("--secure-bound", "> 0"),
    ),
    Case(
        "deploy app with a secure bound but no secure aggregation",
        _app("--secure-bound", "2"),
        2,
        ("--secure-bound", "--secure-aggregation"),
    ),
    # --- bench-deploy ----------------------------------------------------------------------
    Case(
        "bench-deploy with a task poll Flower does not accept",
        lambda tmp, s: ["bench-deploy", "--out", tmp / "bench", "--task-poll", "0"],
        2,
        ("--task-poll", "0.01..60 seconds"),
    ),
    Case(
        "bench-deploy of two rounds",
        lambda tmp, s: ["bench-deploy", "--out", tmp / "bench", "--rounds", "2"],
        2,
        ("--rounds must be 3..1000", "first and the last rounds are left out"),
    ),
    Case(
        "bench-deploy with a sheet algorithm medfed does not have",
        lambda tmp, s: ["bench-deploy", "--out", tmp / "bench", "--sheet-algorithm", "fedx"],
        2,
        ("--sheet-algorithm", "fedx", "unknown algorithm", "choose one of"),
    ),
    # --- deploy worker: where its socket may go ----------------------------------------------
    Case(
        "deploy worker on a path that is a file",
        _worker_on_a_file,
        2,
        ("worker socket", "not a socket"),
    ),
    Case(
        "deploy worker in a folder that does not exist",
        lambda tmp, s: ["deploy", "worker", tmp / "nofolder" / "w.sock"],
        2,
        ("worker socket", "nofolder", "does not exist"),
    ),
    Case(
        "deploy worker under a path that is a plain file",
        _worker_under_a_file,
        2,
        ("worker socket", "plain", "is a file, not a folder"),
    ),
    Case(
        "deploy worker in a folder everyone may write to",
        _worker_in_a_shared_folder,
        2,
        ("worker socket", "others may write to"),
    ),
]

# The rows use no shared sites or run: a stand-in keeps the shared fixture (which trains) unbuilt.
NOTHING_SHARED = Shared(data=Path("/nonexistent/data"), run=Path("/nonexistent/run"))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path) -> None:
    check(case, tmp_path, NOTHING_SHARED)


def test_the_corpus_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_a_refused_deployment_leaves_nothing_behind(tmp_path) -> None:
    for make in (_pki(hosts=("a b",)), _app(run_dir="")):
        check(Case("refused", make, 2, ()), tmp_path, NOTHING_SHARED)
    assert not (tmp_path / "pki").exists() and not (tmp_path / "app").exists()


def test_two_site_secure_aggregation_runs_only_when_accepted(tmp_path) -> None:
    import tomllib

    from medfed.core.errors import ConfigError
    from medfed.flower.server_app import Deployment

    accepted = _app("--secure-aggregation", "--secure-aggregation-two-sites")
    check(Case("accepted", accepted, 0, ("wrote",)), tmp_path, NOTHING_SHARED)
    pyproject = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text(encoding="utf-8"))
    run_config = pyproject["tool"]["flwr"]["app"]["config"]
    assert run_config["secure-aggregation-two-sites"] is True
    assert Deployment.from_run_config(run_config).secure_aggregation
    del run_config["secure-aggregation-two-sites"]
    with pytest.raises(ConfigError, match="secure-aggregation-two-sites"):
        Deployment.from_run_config(run_config)


def test_an_app_folder_with_the_old_learning_rate_flag_is_refused_by_name(tmp_path) -> None:
    import tomllib

    from medfed.core.errors import ConfigError
    from medfed.flower.server_app import Deployment

    check(Case("written", _app(), 0, ("wrote",)), tmp_path, NOTHING_SHARED)
    pyproject = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text(encoding="utf-8"))
    run_config = pyproject["tool"]["flwr"]["app"]["config"]
    assert "lr" not in tomllib.loads(run_config["train"])["train"]  # the modality sets it
    run_config["lr-from-modality"] = True  # as an older medfed wrote the app folder
    with pytest.raises(ConfigError, match=r"'lr-from-modality'.*'medfed deploy app'.*approve"):
        Deployment.from_run_config(run_config)
