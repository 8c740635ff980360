"""Deployment on Flower: ``medfed deploy app|pki|worker``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from medfed.cli.common import DEPLOYMENT, adder, friendly, with_registries
from medfed.cli.settings import given_settings, training_options
from medfed.errors import ConfigError, require_extra


def _stored_train_settings(train_config: Path | None) -> dict[str, Any]:
    """The settings of --train-config's 'train' table (none without the option)."""
    from medfed.flower.node import train_config_from_toml

    if train_config is None:
        return {}
    if train_config.is_dir():
        raise ConfigError(
            f"--train-config {train_config} is a folder: give the TOML file with the 'train' table"
        )
    if not train_config.is_file():
        raise ConfigError(f"--train-config {train_config}: no such file")
    try:
        text = train_config.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--train-config {train_config}: not UTF-8 text ({exc})") from None
    return train_config_from_toml(text, str(train_config)).to_dict()


@friendly
@training_options(
    "algorithm",
    "params",
    "rounds",
    "local_steps",
    "seed",
    config="--train-config",
    from_config=True,
    help={"algorithm": "Algorithm (listed below); default: --train-config's, else feddrm."},
)
def deploy_app_folder(
    out: Annotated[Path, typer.Argument(help="Folder to write (then: flwr run OUT CONNECTION).")],
    site: Annotated[list[str], typer.Option(help="Site ids in order (repeat), as in manifests.")],
    run_dir: Annotated[str, typer.Option(help="Run directory on the SuperLink's machine.")],
    settings: dict[str, Any] | None = None,  # the settings' options go here (training_options)
    train_config: Annotated[
        Path | None,
        typer.Option(help="TOML with a 'train' table (any training setting, as in config.toml)."),
    ] = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for every site to connect.")] = 300,
    reply_timeout: Annotated[
        float, typer.Option(help="Seconds a round waits for a site's reply.")
    ] = 600,
    resume: Annotated[bool, typer.Option(help="Continue the run in --run-dir.")] = False,
    secure_aggregation: Annotated[
        bool,
        typer.Option(
            help="SecAgg+: the server learns only the weighted mean of each round's updates "
            "(3 or more sites; docs/privacy.md, 'Threat model')."
        ),
    ] = False,
    # \[ : rich help would read a bare [default: ...] as a style tag and drop it.
    secure_bound: Annotated[
        float | None,
        typer.Option(
            help="With --secure-aggregation: how far one weight may move in a round before its "
            "site clips the difference (counted in metrics.jsonl) \\[default: 1.0].",
        ),
    ] = None,
) -> None:
    """Write the Flower app folder of one run: medfed's ServerApp, ClientApp and settings."""
    from medfed.config import merge_train_settings

    for module in ("flwr", "cryptography"):
        require_extra(module, "flower", "medfed deploy app")
    from medfed.flower.deploy import write_app

    if str(out) in ("", "."):
        raise ConfigError("OUT is empty (or '.'): give the app folder by name, e.g. pilot_app")
    if secure_bound is not None and not secure_aggregation:
        raise ConfigError(
            "--secure-bound sets secure aggregation's clipping; add --secure-aggregation, or "
            "leave --secure-bound out"
        )
    algorithm = (settings or {}).get("algorithm")
    if algorithm is not None and not algorithm.strip():
        raise ConfigError("--algorithm is empty: name one (listed in --help), or leave it out")
    stored = _stored_train_settings(train_config)
    given = given_settings(
        {**(settings or {}), "algorithm": algorithm or (None if stored else "feddrm")}
    )
    where = str(train_config) if train_config is not None else None
    from medfed.federation.plan import checked_deployment, resolved_settings

    config = resolved_settings(merge_train_settings(stored, given, where=where), where=where)
    try:
        checked_deployment(config, site)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None
    path = write_app(
        out,
        config,
        site,
        run_dir,
        wait_s=wait,
        reply_timeout_s=reply_timeout,
        resume=resume,
        lr_from_modality="lr" not in stored,  # CT and fundus differ (see medfed train --lr)
        secure_aggregation=secure_aggregation,
        **({"secure_bound": secure_bound} if secure_bound is not None else {}),
    )
    typer.echo(f"wrote {path}")
    typer.echo(f"submit it with: flwr run {out} <connection> --stream")


@friendly
def deploy_pki(
    out: Annotated[Path, typer.Argument(help="Folder for the certificates and keys.")],
    host: Annotated[list[str], typer.Option(help="SuperLink host name or IP (repeatable).")],
    site: Annotated[list[str], typer.Option(help="One authentication key pair per site id.")],
    days: Annotated[int, typer.Option(help="Validity of the certificates.")] = 365,
) -> None:
    """A pilot's CA, the SuperLink's TLS certificate and one key pair per SuperNode."""
    require_extra("cryptography", "flower", "medfed deploy pki")
    if str(out) in ("", "."):
        raise ConfigError("OUT is empty (or '.'): give the PKI folder by name, e.g. pki")
    from medfed.flower.deploy import write_pki

    pki = write_pki(out, host, site, days)
    typer.echo(f"CA certificate (give to every SuperNode and flwr user): {pki.ca_cert}")
    typer.echo(f"SuperLink certificate and key: {pki.server_cert}, {pki.server_key}")
    for name, (private, public) in pki.node_keys.items():
        typer.echo(f"site {name}: private key {private} (stays at the site), public key {public}")


@friendly
def deploy_worker(
    socket_path: Annotated[
        Path, typer.Argument(help="Unix socket to serve on (a folder only this account writes).")
    ],
) -> None:
    """A hospital's resident worker, answering its SuperNode's messages from one process.

    It answers the training and evaluation messages from one process, so PyTorch and the
    site's scans load once, not once per message. Start it beside the SuperNode, under the same
    account, and add worker="SOCKET" to the SuperNode's --node-config; stop it with Ctrl-C or
    SIGTERM."""
    require_extra("flwr", "flower", "medfed deploy worker")
    import signal

    from medfed.flower import client_work  # noqa: F401  (PyTorch now, not at the first message)
    from medfed.flower.worker import WorkerServer

    server = WorkerServer(socket_path)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    typer.echo(f"medfed worker serving on {socket_path}")
    typer.echo(f'add worker="{socket_path}" to the SuperNode\'s --node-config')
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("medfed worker stopped")
    finally:
        server.server_close()


def register(app: typer.Typer) -> None:
    deploy_app = typer.Typer(
        help="Run a federation across real machines on Flower (SuperLink + one SuperNode per "
        "site).",
        suggest_commands=False,  # click suggests (see medfed.cli.app)
    )
    app.add_typer(deploy_app, name="deploy", rich_help_panel=DEPLOYMENT)
    add = adder(deploy_app)
    add(deploy_app_folder, "app", cls=with_registries("algorithms"))
    add(deploy_pki, "pki")
    add(deploy_worker, "worker")
