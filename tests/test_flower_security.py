"""What a deployed run's server accepts from its sites, and where a SuperNode keeps its state.

Unit tests of the pieces, without starting any Flower process: a site's description and
published entry are checked before the server uses them, nothing a site sends is expanded
against the server's environment, and a run's or site's name never leaves the state folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from medfed.config import load_manifest, parse_manifest
from medfed.core.errors import ConfigError
from medfed.flower.node import _safe, train_config_from_toml

SECRET = "MEDFED_TEST_SERVER_SECRET"


def _manifest(root: str, site_id: str = "acrima") -> dict:
    return {
        "id": site_id,
        "modality": "fundus",
        "layout": "acrima",
        "root": root,
        "labels": {"normal": 0, "glaucoma": 1},
    }


@pytest.mark.parametrize("root", [f"${SECRET}/scans", f"${{{SECRET}}}/scans", "~/scans"])
def test_a_stored_or_received_manifest_is_not_expanded(monkeypatch, root) -> None:
    monkeypatch.setenv(SECRET, "/the/server/secret")
    manifest = parse_manifest(_manifest(root), where="received", base_dir=Path("/"))
    assert str(manifest.root) == "/" + root  # taken as written (relative to base_dir)


def test_a_manifest_rebuilt_from_a_run_is_not_expanded(monkeypatch) -> None:
    from medfed.routing.bundle import manifest_from_dict

    monkeypatch.setenv(SECRET, "/the/server/secret")
    manifest = manifest_from_dict(_manifest(f"/data/${SECRET}"))
    assert str(manifest.root) == f"/data/${SECRET}"


def test_a_received_manifest_with_an_unset_variable_is_taken_as_written(monkeypatch) -> None:
    monkeypatch.delenv(SECRET, raising=False)
    manifest = parse_manifest(_manifest(f"/data/${SECRET}"), where="received", base_dir=Path("/"))
    assert str(manifest.root) == f"/data/${SECRET}"


def test_a_local_manifest_file_still_expands(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(SECRET, str(tmp_path / "scans"))
    path = tmp_path / "site.toml"
    path.write_text(
        f'id = "acrima"\nmodality = "fundus"\nlayout = "acrima"\nroot = "${SECRET}"\n'
        "[labels]\nnormal = 0\nglaucoma = 1\n",
        encoding="utf-8",
    )
    assert load_manifest(path).root == tmp_path / "scans"


@pytest.mark.parametrize("name", ["..", ".", "", "...", "../..", "a/../../b", "/etc", "run 1"])
def test_a_state_folder_name_stays_inside_its_parent(tmp_path, name) -> None:
    safe = _safe(name)
    assert safe not in ("", ".", "..")
    assert "/" not in safe and "\\" not in safe
    assert (tmp_path / safe).resolve().parent == tmp_path.resolve()


def test_ordinary_names_are_kept() -> None:
    assert _safe("feddrm-run_2.a") == "feddrm-run_2.a"
    assert _safe("..") != _safe(".")


def test_run_settings_whose_train_is_not_a_table_are_refused() -> None:
    with pytest.raises(ConfigError, match="'train' must be a \\[train\\] table"):
        train_config_from_toml("train = 5\n", "run config 'train'")


# --- the server's side (imports Flower's message types; starts nothing) -------------------------

flwr = pytest.importorskip("flwr")


def _info(**changes) -> dict:
    info = {
        "id": "acrima",
        "modality": "fundus",
        "labels": {"normal": 0, "glaucoma": 1},
        "input_shape": [3, 64, 64],
        "n_train": 14,
        "manifest": _manifest(f"${SECRET}/scans"),
    }
    return info | changes


def test_a_site_description_is_checked_and_never_expanded(monkeypatch) -> None:
    from medfed.flower.messenger import site_info

    monkeypatch.setenv(SECRET, "/the/server/secret")
    sent = _info()
    sent["manifest"]["manifest_path"] = "/etc/passwd"  # a path on the site's machine
    site = site_info(sent, ["acrima", "rimone"])
    assert site.input_shape == (3, 64, 64)
    assert site.manifest["root"] == f"${SECRET}/scans"
    assert site.manifest["manifest_path"] == ""  # never opened on the server's machine


@pytest.mark.parametrize(
    ("info", "message"),
    [
        (_info(id="../../etc"), "does not list"),
        (_info(id="refuge"), "does not list"),
        (_info(n_train="14"), "wrong kind"),
        (_info(input_shape=[3, -1, 64]), "wrong kind"),
        (_info(labels={"normal": "0"}), "wrong kind"),
        (_info(extra=1), "expected"),
        ({"id": "acrima"}, "expected"),
        ("acrima", "not a JSON object"),
    ],
)
def test_a_bad_site_description_is_refused(info, message) -> None:
    from medfed.flower.messenger import site_info

    with pytest.raises(ValueError, match=message):
        site_info(info, ["acrima", "rimone"])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"id": "../../x", "index": 0, "manifest": _manifest("/d")}, "as site '../../x'"),
        ({"id": "rimone", "index": 0, "manifest": _manifest("/d")}, "as site 'rimone'"),
        ({"id": "acrima", "index": 1, "manifest": _manifest("/d")}, "expected 'acrima'"),
        ({"id": "acrima", "index": 0, "manifest": _manifest("/d", "rimone")}, "another site"),
        ({"id": "acrima", "index": 0, "manifest": _manifest("/d")}, "unusable site entry"),
        ([], "expected 'acrima'"),
    ],
)
def test_a_published_entry_must_be_the_sites_own(entry, message) -> None:
    from medfed.flower.link import published_entry

    with pytest.raises(ValueError, match=message):
        published_entry(entry, "acrima", 0)


def _run_config(**changes) -> dict:
    train = 'algorithm = "fedavg"\nrounds = 2\n'
    return {"train": train, "sites": "acrima,rimone", "run-dir": "/tmp/run"} | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sites": "acrima,acrima"}, "unique"),
        ({"sites": "acrima,../x"}, "unique"),
        ({"resume": "yes"}, "'resume' must be true or false"),
        ({"lr-from-modality": True}, "written by an older medfed.*approve its plan"),
        ({"wait-s": "soon"}, "'wait-s' must be a number"),
        ({"reply-timeout-s": 0.0}, "'reply-timeout-s' must be a number"),
        ({"wait-s": 1e300}, "'wait-s' must be a number of seconds > 0 and at most 604800"),
        ({"reply-timeout-s": "inf"}, "'reply-timeout-s' must be a number"),
        ({"predictions": "everywhere"}, "'predictions' must be one of site, coordinator"),
        ({"predictions": True}, "'predictions' must be one of site, coordinator"),
        ({"sites": " , "}, "names no site"),
        ({"sites": ""}, "names no site"),
        ({"train": 'algorithm = "fedavg"\nrounds = 2\nfaults = ["1:nosuch:drop"]\n'}, "nosuch"),
        ({"train": 'algorithm = "local"\nrounds = 2\nfaults = ["1:acrima:nan"]\n'}, "no update"),
    ],
)
def test_a_bad_run_config_is_refused_by_name(changes, message) -> None:
    from medfed.flower.server_app import Deployment

    with pytest.raises(ConfigError, match=message):
        Deployment.from_run_config(_run_config(**changes))


def test_a_good_run_config_is_read() -> None:
    from medfed.flower.server_app import Deployment

    deployment = Deployment.from_run_config(_run_config(resume=True, **{"wait-s": 5}))
    assert deployment.sites == ["acrima", "rimone"]
    assert deployment.resume is True and deployment.wait_s == 5.0


@pytest.mark.parametrize(("chosen", "lr"), [("", 3e-4), ("lr = 0.05\n", 0.05)])
def test_a_run_without_a_learning_rate_takes_its_sites_modality(chosen, lr):
    from medfed.federation.coordinator import SiteInfo
    from medfed.flower import server_app

    train = 'algorithm = "fedavg"\nrounds = 2\n' + chosen
    deployment = server_app.Deployment.from_run_config(_run_config(train=train))
    run = server_app.FlowerRun(grid=None, deployment=deployment)
    info = SiteInfo("acrima", "ct", {"normal": 0, "lesion": 1}, (1, 16, 48, 48), 10, {})
    seen = []

    class Stop(Exception):
        pass

    def coordinator(plan, *rest):
        seen.append(plan.config.lr)
        raise Stop

    run.messenger.discover = lambda *_plan: [info]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server_app, "Coordinator", coordinator)
        with pytest.raises(Stop):
            run.run()
    assert seen == [lr]
    # The plan the sites approve leaves the rate out where the modality sets it.
    assert ("lr" in deployment.plan().train) is bool(chosen)


# --- the app folder and the pilot's keys ----------------------------------------------------------


def test_the_app_folder_never_replaces_another_project(tmp_path) -> None:
    pytest.importorskip("cryptography")
    from medfed.config import TrainConfig
    from medfed.flower.deploy import write_app

    config = TrainConfig(algorithm="fedavg", rounds=2)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="not a medfed app"):
        write_app(tmp_path, config, ["a", "b"], "/tmp/run")
    assert "mine" in (tmp_path / "pyproject.toml").read_text(encoding="utf-8")
    app = tmp_path / "app"
    write_app(app, config, ["a", "b"], "/tmp/run")
    write_app(app, config, ["a", "b", "c"], "/tmp/run")  # its own folder may be written again
    assert "a,b,c" in (app / "pyproject.toml").read_text(encoding="utf-8")


def test_the_pki_never_replaces_existing_keys(tmp_path) -> None:
    pytest.importorskip("cryptography")
    from medfed.flower.deploy import write_pki

    write_pki(tmp_path, ["127.0.0.1"], ["acrima"])
    before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(ConfigError, match="already exists"):
        write_pki(tmp_path, ["127.0.0.1"], ["rimone"])
    assert (tmp_path / "ca.key").read_bytes() == before
    with pytest.raises(ConfigError, match="--days"):
        write_pki(tmp_path / "new", ["127.0.0.1"], ["acrima"], days=0)


# --- the names the certificates carry ------------------------------------------------------------

LONGEST_NAME = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters, every part at most 63


@pytest.mark.parametrize(
    "host",
    ["link.example.org", "localhost", "10.0.0.5", "::1", "2001:db8::7", "xn--bcher-kva.example",
     "a-1.b2", LONGEST_NAME],
)  # fmt: skip
def test_a_good_host_is_taken_as_given(host) -> None:
    from medfed.flower.deploy import check_host

    assert len(LONGEST_NAME) == 253
    assert check_host(host) == host


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("", "--host is empty"),
        ("a" * 64, "1 to 63"),
        ("a b/c", "not an IP address nor a DNS name"),
        ("-link.example.org", "not first or last"),
        ("link..example.org", "not an IP address nor a DNS name"),
        ("link.example.org.", "not an IP address nor a DNS name"),
        ("under_score.org", "not an IP address nor a DNS name"),
        ("bücher.example", "xn--"),
        ("*.example.org", "not an IP address nor a DNS name"),
        ("999.1.1.1", "not a valid IP address"),
        ("10.0.0", "not a valid IP address"),
        ("fe80::1%eth0", "IPv6 zone"),
        (LONGEST_NAME + "b", "at most 253"),
    ],
)
def test_a_host_no_tls_client_can_match_is_refused(host, message) -> None:
    from medfed.flower.deploy import check_host

    with pytest.raises(ConfigError, match=message):
        check_host(host)


def test_a_long_host_name_goes_into_the_alternative_names(tmp_path) -> None:
    pytest.importorskip("cryptography")
    from cryptography import x509

    from medfed.flower.deploy import write_pki

    pki = write_pki(tmp_path / "pki", [LONGEST_NAME, "10.0.0.5"], ["acrima"], days=36500)
    cert = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [LONGEST_NAME]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]


@pytest.mark.parametrize(
    ("hosts", "sites", "days", "message"),
    [
        (["h"], ["acrima"], 36501, "--days must be 1 to 36500"),
        (["h"], ["acrima"], 10**8, "--days"),
        (["h", "h"], ["acrima"], 365, "--host h is given twice"),
        (["h"], ["a" * 65], 365, "--site"),
        (["h"], [".."], 365, "--site '..'"),
        (["h"], ["a", "a"], 365, "--site a is given twice"),
    ],
)
def test_a_bad_pki_request_writes_nothing(tmp_path, hosts, sites, days, message) -> None:
    pytest.importorskip("cryptography")
    from medfed.flower.deploy import write_pki

    with pytest.raises(ConfigError, match=message):
        write_pki(tmp_path / "pki", hosts, sites, days)
    assert not (tmp_path / "pki").exists()


@pytest.mark.parametrize(
    ("run_dir", "message"), [("", "--run-dir is empty"), (" ", "empty"), ("/", "folder name")]
)
def test_an_app_needs_a_run_directory_that_names_the_run(tmp_path, run_dir, message) -> None:
    pytest.importorskip("cryptography")
    from medfed.config import TrainConfig
    from medfed.flower.deploy import write_app

    with pytest.raises(ConfigError, match=message):
        write_app(tmp_path / "app", TrainConfig(algorithm="fedavg"), ["a"], run_dir)
    assert not (tmp_path / "app").exists()


@pytest.mark.parametrize("wait", [0.0, -1.0, float("nan"), float("inf"), 7 * 24 * 3600.0 + 1])
def test_an_app_waits_a_bounded_time(tmp_path, wait) -> None:
    pytest.importorskip("cryptography")
    from medfed.config import TrainConfig
    from medfed.flower.deploy import write_app

    config = TrainConfig(algorithm="fedavg")
    with pytest.raises(ConfigError, match="--wait must be"):
        write_app(tmp_path / "app", config, ["a"], "/r", wait_s=wait)
    with pytest.raises(ConfigError, match="--reply-timeout must be"):
        write_app(tmp_path / "app", config, ["a"], "/r", reply_timeout_s=wait)


def test_the_app_folder_leaves_the_learning_rate_to_the_modality_unless_chosen(tmp_path) -> None:
    pytest.importorskip("cryptography")
    import tomllib

    from typer.testing import CliRunner

    from medfed.cli import app

    def written(*extra: str) -> float | None:
        out = tmp_path / f"app{len(list(tmp_path.iterdir()))}"
        args = ["deploy", "app", str(out), "--site", "a", "--site", "b", "--run-dir", "/tmp/r"]
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        pyproject = tomllib.loads((out / "pyproject.toml").read_text(encoding="utf-8"))
        run_config = pyproject["tool"]["flwr"]["app"]["config"]
        assert "lr-from-modality" not in run_config
        return tomllib.loads(run_config["train"])["train"].get("lr")

    chosen = tmp_path / "train.toml"
    chosen.write_text('[train]\nalgorithm = "fedavg"\nlr = 0.01\n', encoding="utf-8")
    assert written() is None
    assert written("--train-config", str(chosen)) == 0.01
