"""Deployment on Flower: ``medfed deploy app|stats|pki|worker|approve|audit|policy check``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from medfed.cli.common import DEPLOYMENT, adder, friendly, with_registries
from medfed.cli.settings import given_settings, training_options
from medfed.core.errors import ConfigError, require_extra
from medfed.flower.waits import REPLY_TIMEOUT_S, WAIT_S

# What both app folders take (medfed deploy app, stats). The waits' defaults and bound (a
# week) are medfed.flower.waits'.
AppFolderArg = Annotated[
    Path, typer.Argument(help="Folder to write (then: flwr run OUT CONNECTION).")
]
SitesOpt = Annotated[list[str], typer.Option(help="Site ids in order (repeat), as in manifests.")]
RunDirOpt = Annotated[str, typer.Option(help="Run directory on the SuperLink's machine.")]
WaitOpt = Annotated[
    float, typer.Option(help="Seconds to wait for every site to connect (statistics: to answer).")
]
ReplyTimeoutOpt = Annotated[
    float, typer.Option(help="Seconds one exchange (a round) waits for the sites' replies.")
]


def _stored_train_settings(train_config: Path | None) -> dict[str, Any]:
    """The settings of --train-config's 'train' table as the file spells them (none without
    the option); checked once merged with the command line's, which take precedence."""
    import tomllib

    if train_config is None:
        return {}
    if train_config.is_dir():
        raise ConfigError(
            f"--train-config {train_config} is a folder: give the TOML file with the 'train' table"
        )
    if not train_config.is_file():
        raise ConfigError(f"--train-config {train_config}: no such file")
    try:
        data = tomllib.loads(train_config.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--train-config {train_config}: not UTF-8 text ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--train-config {train_config}: not valid TOML ({exc})") from None
    train = data.get("train", data)
    if not isinstance(train, dict):
        raise ConfigError(
            f"--train-config {train_config}: 'train' must be a [train] table of training settings"
        )
    return dict(train)


def _check_secure_options(secure: bool, bound: float | None, two_sites: bool) -> None:
    """The options that tune secure aggregation come with --secure-aggregation."""
    for given, option in (
        (bound is not None, "--secure-bound"),
        (two_sites, "--secure-aggregation-two-sites"),
    ):
        if given and not secure:
            raise ConfigError(
                f"{option} tunes secure aggregation; add --secure-aggregation, or leave "
                f"{option} out"
            )


@friendly
@training_options(
    "algorithm",
    "params",
    "rounds",
    "local_steps",
    "seed",
    config="--train-config",
    from_config=True,
    help={
        "algorithm": "Algorithm (listed below); over --train-config's (a setting given here "
        "wins over the file's); default: the file's, else feddrm."
    },
)
def deploy_app_folder(
    out: AppFolderArg,
    site: SitesOpt,
    run_dir: RunDirOpt,
    settings: dict[str, Any] | None = None,  # the settings' options go here (training_options)
    train_config: Annotated[
        Path | None,
        typer.Option(help="TOML with a 'train' table (any training setting, as in config.toml)."),
    ] = None,
    wait: WaitOpt = WAIT_S,
    reply_timeout: ReplyTimeoutOpt = REPLY_TIMEOUT_S,
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
    secure_aggregation_two_sites: Annotated[
        bool,
        typer.Option(
            help="With --secure-aggregation over exactly 2 sites: accept that each site can "
            "recover the other's update from the mean (docs/privacy.md, 'Threat model')."
        ),
    ] = False,
    on_refusal: Annotated[
        str,
        typer.Option(
            help="When a site's policy refuses the run: stop, or continue without that site."
        ),
    ] = "stop",
    predictions_to_coordinator: Annotated[
        bool,
        typer.Option(
            help="Each site sends its per-scan test predictions (its policy must allow them); "
            "by default they stay in each site's state folder and only figures leave."
        ),
    ] = False,
) -> None:
    """Write the Flower app folder of one run: medfed's ServerApp, ClientApp and settings."""
    from medfed.config import merge_train_settings

    for module in ("flwr", "cryptography"):
        require_extra(module, "flower", "medfed deploy app")
    from medfed.flower.deploy import write_app

    if str(out) in ("", "."):
        raise ConfigError("OUT is empty (or '.'): give the app folder by name, e.g. pilot_app")
    _check_secure_options(secure_aggregation, secure_bound, secure_aggregation_two_sites)
    algorithm = (settings or {}).get("algorithm")
    if algorithm is not None and not algorithm.strip():
        raise ConfigError("--algorithm is empty: name one (listed in --help), or leave it out")
    stored = _stored_train_settings(train_config)
    # The command line over the file, the file over the defaults (feddrm when neither names
    # an algorithm).
    given = given_settings(
        {
            **(settings or {}),
            "algorithm": algorithm or (None if "algorithm" in stored else "feddrm"),
        }
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
        secure_aggregation=secure_aggregation,
        **({"secure_bound": secure_bound} if secure_bound is not None else {}),
        secure_two_sites=secure_aggregation_two_sites,
        on_refusal=on_refusal,
        predictions_to_coordinator=predictions_to_coordinator,
    )
    typer.echo(f"wrote {path}")
    typer.echo(f"submit it with: flwr run {out} <connection> --stream")


@friendly
def deploy_stats_folder(
    out: AppFolderArg,
    site: SitesOpt,
    run_dir: RunDirOpt,
    run_name: Annotated[str, typer.Option(help="The run's name (default: --run-dir's).")] = "",
    min_count: Annotated[
        int,
        typer.Option(
            help="Suppress every count under this many scans (a site's policy "
            "min_count may ask for more; the larger applies)."
        ),
    ] = 0,
    noise: Annotated[
        str,
        typer.Option(help="Differential-privacy noise on every count: none, laplace or gaussian."),
    ] = "none",
    epsilon: Annotated[
        float, typer.Option(help="With --noise: the privacy budget per site, all counts together.")
    ] = 0.0,
    delta: Annotated[
        float | None, typer.Option(help="With --noise gaussian \\[default: 1e-05].")
    ] = None,
    wait: WaitOpt = WAIT_S,
    reply_timeout: ReplyTimeoutOpt = REPLY_TIMEOUT_S,
) -> None:
    """Write the app folder of a statistics-only run: no training, no weights.

    Each site answers once with its data card's statistics (counts per split and class, image
    sizes, intensity histograms per channel, acquisition devices), cells under the minimum
    count suppressed and, with --noise, every count noised; the coordinator writes
    RUN/statistics.json, shown on the dashboard's Sites page. Sites approve its plan as any
    other ('medfed deploy policy check', 'medfed deploy approve')."""
    require_extra("flwr", "flower", "medfed deploy stats")
    from medfed.flower.deploy import write_statistics_app
    from medfed.flower.statistics import default_delta
    from medfed.governance.statistics import StatisticsSettings

    if str(out) in ("", "."):
        raise ConfigError("OUT is empty (or '.'): give the app folder by name, e.g. stats_app")
    settings = StatisticsSettings(
        min_count=min_count, noise=noise, epsilon=epsilon, delta=default_delta(noise, delta)
    )
    path = write_statistics_app(
        out, settings, site, run_dir, run_name=run_name, wait_s=wait,
        reply_timeout_s=reply_timeout,
    )  # fmt: skip
    typer.echo(f"wrote {path}")
    typer.echo(f"disclosure control: {settings.words()}")
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


def _app_plan(run: Path) -> Any:
    """The plan of the run in the app folder ``run`` (as the coordinator will send it)."""
    require_extra("flwr", "flower", "medfed deploy policy check / approve")
    from medfed.flower.statistics import StatisticsDeployment, statistics_run_config

    stats = statistics_run_config(run)
    if stats is not None:
        return StatisticsDeployment.from_run_config(stats).plan()
    from medfed.flower.server_app import Deployment
    from medfed.governance.plan import app_run_config

    return Deployment.from_run_config(app_run_config(run)).plan()


RUN_HELP = "The run's app folder (written by 'medfed deploy app', as the coordinator sent it)."
STATE_HELP = "The SuperNode's state-dir (its --node-config), where approvals are kept."


def _modalities(modality: str | None) -> list[str]:
    """The modalities --modality names (every one when not given)."""
    from medfed.config import Modality

    known = [str(m) for m in Modality]
    if modality is None:
        return known
    if modality.strip().lower() not in known:
        raise ConfigError(f"--modality {modality!r}: expected one of {', '.join(known)}")
    return [modality.strip().lower()]


def _auto_backbones(config: Any, modalities: list[str]) -> dict[str, str | None]:
    """Modality -> the backbone a run's 'auto' resolves to at a site of it; {"": None} when
    the run names its backbone (the check takes it as it is)."""
    if config.backbone != "auto":
        return {"": None}
    from medfed.algorithms import make_algorithm
    from medfed.federation.plan import resolved_backbone

    algorithm = make_algorithm(config.algorithm, config.params)
    return {m: resolved_backbone(config, m, algorithm) for m in modalities}


@friendly
def deploy_policy_check(
    policy: Annotated[Path, typer.Argument(help="The site's policy TOML file.")],
    run: Annotated[Path, typer.Option(help=RUN_HELP)],
    site: Annotated[
        str | None, typer.Option(help="The site's id, checked against the policy's 'site'.")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help=STATE_HELP + " Approvals there count as approved.")
    ] = None,
    modality: Annotated[
        str | None,
        typer.Option(
            help="The site's modality (fundus or ct): a run's backbone 'auto' is checked as it "
            "resolves there (default: as it resolves for each modality)."
        ),
    ] = None,
) -> None:
    """Whether a site's policy would accept a run, rule by rule, before it is submitted.

    A backbone 'auto' is resolved first, as the site will resolve it, then checked against
    allow.backbones. Exit 0: accepted; 1: refused (each broken rule named); 2: an unusable
    policy or app."""
    from medfed.governance.checks import check_plan
    from medfed.governance.policy import load_policy
    from medfed.governance.records import approved_plans
    from medfed.governance.statistics import (
        check_statistics_plan,
        is_statistics_plan,
        plan_lines,
    )

    modalities = _modalities(modality)
    rules = load_policy(policy)
    plan = _app_plan(run)
    approved = approved_plans(state_dir) if state_dir is not None else set()
    for line in plan_lines(plan):
        typer.echo(line)
    if is_statistics_plan(plan):
        found = check_statistics_plan(rules, plan, site=site, approved=approved)
    else:
        found = []
        for where, backbone in _auto_backbones(plan.config, modalities).items():
            if where:
                typer.echo(f"backbone auto resolves to {backbone} at a {where} site")
            for refusal in check_plan(rules, plan, site=site, approved=approved, backbone=backbone):
                if refusal.rule == "allow.backbones" and where:
                    refusal = type(refusal)(refusal.rule, f"{refusal.reason} (auto, {where} site)")
                if refusal not in found:
                    found.append(refusal)
    if found:
        for refusal in found:
            typer.echo(f"refused: rule {refusal.rule}: {refusal.reason}")
        raise typer.Exit(1)
    typer.echo(f"accepted: {policy} allows this run")


@friendly
def deploy_approve(
    run: Annotated[Path, typer.Option(help=RUN_HELP)],
    state_dir: Annotated[Path, typer.Option(help=STATE_HELP)],
    note: Annotated[str, typer.Option(help="Why, or on whose decision (kept with it).")] = "",
) -> None:
    """Approve a run's plan at this site: its SuperNode then trains on it (and on no other).

    The plan is the app, the resolved settings and the starting weights' hash; any change to
    them is a new plan, to be approved again. The approval is recorded in
    STATE_DIR/approvals.jsonl (owner-only, append-only)."""
    from medfed.governance.records import APPROVALS, record_approval
    from medfed.governance.statistics import plan_lines

    plan = _app_plan(run)
    for line in plan_lines(plan):
        typer.echo(line)
    record_approval(state_dir, plan, note=note)
    typer.echo(f"approved plan {plan.sha256}; recorded in {state_dir / APPROVALS}")


@friendly
def deploy_audit(
    state_dir: Annotated[Path, typer.Argument(help="The SuperNode's state-dir.")],
    run: Annotated[str | None, typer.Option(help="Only this run's messages.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON record per line.")] = False,
) -> None:
    """The site's audit log: every message its SuperNode received and sent, with the decision.

    Run, round, kind, size and sha256 of each message, and the policy's decision (accepted,
    refused with the rule, or unchecked)."""
    import json

    from medfed.governance.records import AUDIT, AUDIT_HEADER, audit_rows, read_audit
    from medfed.reports.markdown import markdown_table

    if not (state_dir / AUDIT).is_file():
        raise ConfigError(f"{state_dir / AUDIT}: no audit log; give the SuperNode's state-dir")
    records = [r for r in read_audit(state_dir) if run is None or r.get("run") == run]
    if as_json:
        for record in records:
            typer.echo(json.dumps(record, sort_keys=True))
        return
    typer.echo(markdown_table(AUDIT_HEADER, audit_rows(records)))
    refused = sum(1 for r in records if r.get("decision") == "refused")
    typer.echo(f"{len(records)} record(s); {refused} refused")


def register(app: typer.Typer) -> None:
    deploy_app = typer.Typer(
        help="Run a federation across real machines on Flower (SuperLink + one SuperNode per "
        "site).",
        suggest_commands=False,  # click suggests (see medfed.cli.app)
    )
    app.add_typer(deploy_app, name="deploy", rich_help_panel=DEPLOYMENT)
    add = adder(deploy_app)
    add(deploy_app_folder, "app", cls=with_registries("algorithms"))
    add(deploy_stats_folder, "stats")
    add(deploy_pki, "pki")
    add(deploy_worker, "worker")
    add(deploy_approve, "approve")
    add(deploy_audit, "audit")
    policy_app = typer.Typer(
        help="A site's policy: what may run on its data and what may leave.",
        suggest_commands=False,
    )
    deploy_app.add_typer(policy_app, name="policy")
    adder(policy_app)(deploy_policy_check, "check")
