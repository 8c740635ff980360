"""Standing a pilot federation up on Flower: the app folder, certificates and node keys.

- :func:`write_app` writes the folder ``flwr run`` submits: a ``pyproject.toml`` whose
  components are medfed's ServerApp and ClientApp and whose run config holds the training
  settings, the site ids in order and the run directory on the SuperLink's machine;
- :func:`write_statistics_app` writes the same for a statistics-only run (no training);
- :func:`write_pki` makes a pilot's certificate authority, the SuperLink's TLS certificate and
  one authentication key pair per hospital (ECDSA P-384, the OpenSSH format Flower reads).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from medfed.config import TrainConfig, valid_site_id
from medfed.core.errors import ConfigError
from medfed.core.fileio import check_out_folder
from medfed.flower import secure
from medfed.flower.waits import MAX_WAIT_S, REPLY_TIMEOUT_S, WAIT_S
from medfed.governance.statistics import StatisticsSettings

# A site id names its key files and the comment of its public key: kept short enough for both.
MAX_SITE_ID = 64
# The longest validity of the pilot's certificates (--days): a hundred years.
MAX_DAYS = 36500
if TYPE_CHECKING:
    from medfed.algorithms.base import Algorithm

_DNS_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _check_sites(sites: list[str]) -> None:
    if not sites:
        raise ConfigError("name the sites of the federation, in order (--site a --site b ...)")
    bad = [s for s in sites if not valid_site_id(s) or len(s) > MAX_SITE_ID]
    if bad:
        raise ConfigError(
            f"--site {bad[0]!r}: a site id is 1 to {MAX_SITE_ID} letters, digits, '.', '_' or "
            "'-', starting with a letter or digit (the id in the site's manifest)"
        )
    twice = sorted({s for s in sites if sites.count(s) > 1})
    if twice:
        raise ConfigError(f"--site {twice[0]} is given twice; name each site once, in order")


def check_wait(option: str, seconds: float) -> float:
    """A wait in seconds: more than 0 and at most :data:`MAX_WAIT_S` (a week)."""
    if not 0 < seconds <= MAX_WAIT_S:
        raise ConfigError(
            f"{option} must be a number of seconds > 0 and at most {MAX_WAIT_S:.0f} "
            f"(a week), got {seconds}"
        )
    return float(seconds)


def check_host(host: str) -> str:
    """A name the SuperLink's certificate can carry, and a TLS client can match: an IP address
    (v4 or v6) or a DNS name of RFC 1123 labels (1 to 63 letters, digits or '-', neither
    first nor last; 253 characters in all). Returned as given."""
    what = f"--host {host!r}"
    if not host:
        raise ConfigError("--host is empty: give the SuperLink's host name or IP address")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if getattr(address, "scope_id", None):
            raise ConfigError(
                f"{what}: a certificate cannot hold an IPv6 zone ('%{address.scope_id}'); "
                "give the address without it"
            )
        return host
    if len(host) > 253:
        raise ConfigError(
            f"--host {host[:40]!r}...: a host name has at most 253 characters, got {len(host)}"
        )
    labels = host.split(".")
    bad = next((label for label in labels if not _DNS_LABEL.fullmatch(label)), None)
    if bad is not None:
        raise ConfigError(
            f"{what}: not an IP address nor a DNS name; each dot-separated part of a host name "
            "is 1 to 63 ASCII letters, digits or '-' (not first or last), e.g. "
            "--host link.example.org or --host 10.0.0.5 (write an international name in its "
            "xn-- form)"
        )
    if labels[-1].isdigit():
        raise ConfigError(
            f"{what}: not a valid IP address, and a host name cannot end in a number; "
            "check the address, e.g. --host 10.0.0.5"
        )
    return host


def check_days(days: int) -> int:
    if not 1 <= days <= MAX_DAYS:
        raise ConfigError(
            f"--days must be 1 to {MAX_DAYS} (the certificates' validity, in days), got {days}"
        )
    return days


def _folder(out: Path, option: str) -> None:
    """``out`` is a folder to write into, or will be one."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option} {out} is a file; give a folder (it is created if missing)")


def refuse_unsupported(config: TrainConfig) -> None:
    """Settings the in-process engine has and a deployment does not (yet): refused up front."""
    if config.normalization == "federation":
        raise ConfigError(
            "normalization = 'federation' runs in one process only; a deployment normalizes "
            "each site with its own statistics: set normalization = 'site' (the default)"
        )


def refuse_insecure_settings(
    config: TrainConfig,
    algorithm: Algorithm,
    n_sites: int,
    bound: float,
    two_sites: bool = False,
) -> None:
    """Refuse, before the run starts, settings that cannot run under secure aggregation
    (``two_sites``: two sites, each able to recover the other's update, were accepted)."""
    per_round = max(config.min_sites, math.ceil(config.client_fraction * n_sites))
    reason = secure.refusal(
        n_sites=n_sites,
        per_round=min(per_round, n_sites),
        algorithm_reason=algorithm.secure_refusal(),
        wire_precision=config.wire_precision,
        wire_delta=config.wire_delta,
        bound=bound,
        two_sites=two_sites,
    )
    if reason:
        raise ConfigError(f"--secure-aggregation: {reason}")


def write_app(
    out: Path,
    config: TrainConfig,
    sites: list[str],
    run_dir: str,
    *,
    run_name: str = "",
    wait_s: float = WAIT_S,
    reply_timeout_s: float = REPLY_TIMEOUT_S,
    resume: bool = False,
    secure_aggregation: bool = False,
    secure_bound: float = secure.DEFAULT_BOUND,
    secure_two_sites: bool = False,
    on_refusal: str = "stop",
    predictions_to_coordinator: bool = False,
) -> Path:
    """Write the Flower app folder for one run; returns its pyproject.toml.

    ``config.lr`` None: the server sets the sites' modality's learning rate once it knows the
    modality (as ``medfed train`` does).
    ``secure_aggregation``: SecAgg+ (:mod:`medfed.flower.secure`), each update's differences
    clipped to ``+-secure_bound``; ``secure_two_sites``: run it over two sites although each can
    recover the other's update. ``on_refusal``: when a site's policy refuses the run,
    ``stop`` it or ``continue`` without that site. ``predictions_to_coordinator``: each site
    sends its per-scan test predictions (the plan lists them, so a site's policy must allow
    them); by default they stay in each site's state folder."""
    _check_sites(sites)
    if on_refusal not in ("stop", "continue"):
        raise ConfigError(f"--on-refusal {on_refusal!r}: give stop or continue")
    refuse_unsupported(config)
    if secure_aggregation:
        from medfed.federation.plan import settle

        algorithm = settle(config, sites).algorithm
        refuse_insecure_settings(
            config, algorithm, len(sites), secure_bound, two_sites=secure_two_sites
        )
    run_dir = _checked_place(out, run_dir, wait_s, reply_timeout_s)
    init_sha256 = ""
    if config.init:  # reading the starting weights loads torch; a random start does not
        from medfed.federation.pretrained import starting_sha256

        init_sha256 = starting_sha256(config.init)
    return write_pyproject(
        out,
        "A medfed federated training run",
        {
            "train": tomli_w.dumps({"train": config.to_dict()}),
            "sites": ",".join(sites),
            "run-dir": str(run_dir),
            "run-name": run_name or Path(run_dir).name,
            "wait-s": float(wait_s),
            "reply-timeout-s": float(reply_timeout_s),
            "resume": bool(resume),
            "secure-aggregation": bool(secure_aggregation),
            "secure-bound": float(secure_bound),
            **({"secure-aggregation-two-sites": True} if secure_two_sites else {}),
            "on-refusal": on_refusal,
            "predictions": "coordinator" if predictions_to_coordinator else "site",
            # The plan's starting weights: sites approve the run by this hash.
            "init-sha256": init_sha256,
        },
    )


MEDFED_APP = ("medfed.flower.server_app:app", "medfed.flower.client_app:app")


def write_pyproject(
    out: Path,
    description: str,
    run_config: dict[str, Any],
    *,
    name: str = "medfed-federation",
    components: tuple[str, str] = MEDFED_APP,
    source: str = "medfed_run.py",
) -> Path:
    """An app folder's pyproject.toml: the ServerApp and ClientApp ``components`` (medfed's,
    unless a bench's own app is named) and this run config."""
    check_out_folder(out, "OUT")
    out.mkdir(parents=True, exist_ok=True)
    server, client = components
    pyproject = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": name,
            "version": "1.0.0",
            "description": description,
            "license": "Apache-2.0",
            "dependencies": [],
        },
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {
                "app": {
                    "publisher": "medfed",
                    "components": {"serverapp": server, "clientapp": client},
                    "config": run_config,
                }
            },
        },
    }
    path = out / "pyproject.toml"
    path.write_text(tomli_w.dumps(pyproject), encoding="utf-8")
    # The bundle must hold at least one source file; the apps themselves come from medfed.
    module = server.split(":")[0]
    (out / source).write_text(
        f'"""{description}: its ServerApp and ClientApp live in {module}."""\n',
        encoding="utf-8",
    )
    return path


def _check_app_folder(out: Path) -> None:
    """``out`` may take an app folder: new, empty, or one medfed wrote."""
    _folder(out, "app folder")
    existing = out / "pyproject.toml"
    if existing.is_file() and not _is_medfed_app(existing):
        raise ConfigError(
            f"{existing} already exists and is not a medfed app folder; "
            "choose an empty or new folder for the app"
        )


def write_statistics_app(
    out: Path,
    settings: StatisticsSettings,
    sites: list[str],
    run_dir: str,
    *,
    run_name: str = "",
    wait_s: float = WAIT_S,
    reply_timeout_s: float = REPLY_TIMEOUT_S,
) -> Path:
    """Write the Flower app folder of a statistics-only run (no training, no weights: each
    site answers once with its data card's statistics, see :mod:`medfed.flower.statistics`);
    returns its pyproject.toml."""
    from medfed.flower.statistics import StatisticsDeployment

    _check_sites(sites)
    run_dir = _checked_place(out, run_dir, wait_s, reply_timeout_s)
    deployment = StatisticsDeployment(
        settings, sites, Path(run_dir), run_name or Path(run_dir).name, wait_s, reply_timeout_s
    )
    config = deployment.run_config()
    config["run-dir"] = run_dir  # as given: a path on the SuperLink's machine
    return write_pyproject(out, "A medfed statistics-only run", config)


def _checked_place(out: Path, run_dir: str, wait_s: float, reply_timeout_s: float) -> str:
    """``--run-dir`` as checked, once the waits and the app folder ``out`` are."""
    check_wait("--wait", wait_s)
    check_wait("--reply-timeout", reply_timeout_s)
    run_dir = check_run_dir(run_dir)
    _check_app_folder(out)
    return run_dir


def check_run_dir(run_dir: str) -> str:
    """``--run-dir``: a path on the SuperLink's machine whose last part names the run."""
    text = str(run_dir).strip()
    if not text:
        raise ConfigError(
            "--run-dir is empty: give the run directory on the SuperLink's machine, "
            "e.g. --run-dir /srv/medfed/runs/pilot1"
        )
    if Path(text).name in ("", ".", ".."):
        raise ConfigError(
            f"--run-dir {run_dir!r} does not end in a folder name (it names the run): "
            "give it as e.g. /srv/medfed/runs/pilot1"
        )
    return text


def _is_medfed_app(path: Path) -> bool:
    """True when ``path`` is a pyproject.toml :func:`write_app` wrote (safe to write again)."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    components = data.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    return components.get("serverapp") == MEDFED_APP[0]


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: dict[str, tuple[Path, Path]]  # site -> (private key, public key)


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "medfed pilot"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def write_pki(out: Path, hosts: list[str], sites: list[str], days: int = 365) -> Pki:
    """A pilot's CA, the SuperLink's certificate for ``hosts`` and a key pair per site.

    For a pilot: a hospital's own PKI should issue the server certificate in production.
    """
    _check_sites(sites)
    if not hosts:
        raise ConfigError("name the SuperLink's host names or IP addresses (--host)")
    for host in hosts:
        check_host(host)
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ConfigError(f"--host {twice[0]} is given twice; name each host once")
    check_days(days)
    _folder(out, "PKI folder")
    taken = [
        out / n for n in ("ca.key", "ca.crt", "server.key", "server.crt") if (out / n).exists()
    ]
    taken += [
        out / f"{s}{ext}" for s in sites for ext in (".key", ".pub") if (out / f"{s}{ext}").exists()
    ]
    if taken:
        raise ConfigError(
            f"{taken[0]} already exists ({len(taken)} file(s) of a PKI in {out}); replacing "
            "them would lock out every SuperNode holding the old ones: choose a new folder"
        )
    check_out_folder(out, "OUT")
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("medfed pilot CA"))
        .issuer_name(_name("medfed pilot CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA384())
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        # A common name holds 64 characters at most; TLS clients match the alternative names.
        .subject_name(_name(hosts[0] if len(hosts[0]) <= 64 else "medfed SuperLink"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    pem = serialization.Encoding.PEM
    (out / "ca.crt").write_bytes(ca_cert.public_bytes(pem))
    _write_private(
        out / "ca.key",
        ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    (out / "server.crt").write_bytes(server_cert.public_bytes(pem))
    _write_private(
        out / "server.key",
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    nodes = {}
    for site in sites:
        nodes[site] = write_node_key(out, site)
    return Pki(out / "ca.crt", out / "server.crt", out / "server.key", nodes)


def write_node_key(out: Path, site: str) -> tuple[Path, Path]:
    """One SuperNode's authentication key pair: ``<site>.key`` (private) and ``<site>.pub``."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = out / f"{site}.key"
    public = out / f"{site}.pub"
    _write_private(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + f" medfed-{site}\n".encode()
    )
    return private, public
