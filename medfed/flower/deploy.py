"""Standing a pilot federation up on Flower: the app folder, certificates and node keys.

- :func:`write_app` writes the folder ``flwr run`` submits: a ``pyproject.toml`` whose
  components are medfed's ServerApp and ClientApp and whose run config holds the training
  settings, the site ids in order and the run directory on the SuperLink's machine;
- :func:`write_pki` makes a pilot's certificate authority, the SuperLink's TLS certificate and
  one authentication key pair per hospital (ECDSA P-384, the OpenSSH format Flower reads).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import tomli_w
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from medfed.config import TrainConfig, valid_site_id
from medfed.errors import ConfigError


def _check_sites(sites: list[str]) -> None:
    if not sites:
        raise ConfigError("name the sites of the federation, in order (--site a --site b ...)")
    bad = [s for s in sites if not valid_site_id(s)]
    if bad or len(set(sites)) != len(sites):
        raise ConfigError(f"site ids must be unique letters, digits, '.', '_' or '-': {sites}")


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


def write_app(
    out: Path,
    config: TrainConfig,
    sites: list[str],
    run_dir: str,
    *,
    run_name: str = "",
    wait_s: float = 300.0,
    reply_timeout_s: float = 600.0,
    resume: bool = False,
) -> Path:
    """Write the Flower app folder for one run; returns its pyproject.toml."""
    _check_sites(sites)
    refuse_unsupported(config)
    for name, seconds in (("--wait", wait_s), ("--reply-timeout", reply_timeout_s)):
        if not 0 < seconds < float("inf"):
            raise ConfigError(f"{name} must be a number of seconds > 0, got {seconds}")
    _folder(out, "app folder")
    existing = out / "pyproject.toml"
    if existing.is_file() and not _is_medfed_app(existing):
        raise ConfigError(
            f"{existing} already exists and is not a medfed app folder; "
            "choose an empty or new folder for the app"
        )
    out.mkdir(parents=True, exist_ok=True)
    pyproject = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": "medfed-federation",
            "version": "1.0.0",
            "description": "A medfed federated training run",
            "license": "Apache-2.0",
            "dependencies": [],
        },
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {
                "app": {
                    "publisher": "medfed",
                    "components": {
                        "serverapp": "medfed.flower.server_app:app",
                        "clientapp": "medfed.flower.client_app:app",
                    },
                    "config": {
                        "train": tomli_w.dumps({"train": config.to_dict()}),
                        "sites": ",".join(sites),
                        "run-dir": str(run_dir),
                        "run-name": run_name or Path(run_dir).name,
                        "wait-s": float(wait_s),
                        "reply-timeout-s": float(reply_timeout_s),
                        "resume": bool(resume),
                    },
                }
            },
        },
    }
    path = out / "pyproject.toml"
    path.write_text(tomli_w.dumps(pyproject), encoding="utf-8")
    # The bundle must hold at least one source file; the apps themselves come from medfed.
    (out / "medfed_run.py").write_text(
        '"""A medfed run: the ServerApp and ClientApp live in medfed.flower."""\n',
        encoding="utf-8",
    )
    return path


def _is_medfed_app(path: Path) -> bool:
    """True when ``path`` is a pyproject.toml :func:`write_app` wrote (safe to write again)."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    components = data.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    return components.get("serverapp") == "medfed.flower.server_app:app"


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
    if days < 1:
        raise ConfigError(f"--days must be at least 1 (the certificates' validity), got {days}")
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
        .subject_name(_name(hosts[0]))
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
