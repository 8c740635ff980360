"""How a run starts, resumes and checkpoints: config.toml, the stored-settings comparison, and
the global state each checkpoint holds.

A resumed run must be the run it continues: the same settings, sites and starting weights,
and a checkpoint whose tensors fit the model config.toml describes.
"""

from __future__ import annotations

import tomllib
from typing import TYPE_CHECKING, Any

import tomli_w

from medfed import __version__
from medfed.algorithms import make_algorithm
from medfed.algorithms.base import State
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError, RunDirError
from medfed.core.fileio import check_out_folder
from medfed.runs.checkpoints import damaged_fix
from medfed.runs.weights import check_tensors

if TYPE_CHECKING:
    from pathlib import Path

    from medfed.federation.coordinator import Coordinator


def resolved_config(server: Coordinator) -> dict[str, Any]:
    """config.toml: the run's settings, model, sites and starting weights."""
    config = {
        "medfed_version": __version__,
        "train": server.config.to_dict() | {"params": server.algorithm.resolved_params()},
        "model": server.spec.to_dict(),
        "sites": [s.manifest for s in server.sites],
    }
    if server.init_report is not None:
        config["init"] = server.init_report.to_dict() | {
            "strict": server.config.init_strict,
            "normalization": server.config.normalization,
        }
    return config


def start_or_resume(
    server: Coordinator, resume: bool, **event: Any
) -> tuple[int, dict[str, State]]:
    """The first round to run, and the checkpointed states when resuming."""
    config = resolved_config(server)
    run = server.run
    if not resume:
        if run.config_path.exists():
            raise ConfigError(
                f"{run.path} already holds a run; pass --resume to continue it "
                "or choose another --out"
            )
        check_out_folder(run.path)
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_config(config)
        run.log_event("start", device=server.device_text, **event)
        _init_event(server)
        return 1, {}
    if not run.config_path.exists():
        raise ConfigError(f"--resume: {run.path} holds no run to resume")
    previous = run.read_config()
    _check_same_run(server, previous, config)
    _check_same_init(server, previous)
    latest = server.store.latest()
    if latest is None:
        run.truncate_metrics(0)
        run.log_event("resume", from_round=0, **event)
        return 1, {}
    states, done = restore(server, latest)
    run.truncate_metrics(done)
    run.log_event("resume", from_round=done, **event)
    return done + 1, states


def _init_event(server: Coordinator) -> None:
    report = server.init_report
    if report is not None:
        server.run.log_event(
            "init",
            source=report.source,
            sha256=report.sha256,
            loaded=len(report.loaded),
            skipped=len(report.skipped),
            random=len(report.random),
        )


def _check_same_run(server: Coordinator, previous: dict[str, Any], config: dict[str, Any]) -> None:
    """The settings and sites of a resumed run are those config.toml records."""
    run = server.run
    for table, kind in (("train", dict), ("sites", list)):
        if not isinstance(previous.get(table), kind):
            raise RunDirError(
                f"{run.config_path}: no usable {table!r} "
                f"{'table' if kind is dict else 'list'}; the file is damaged; restore it "
                "from the run's backup, or train again into a new --out without --resume"
            )
    config = tomllib.loads(tomli_w.dumps(config))  # as stored: tuples become lists
    stored = dict(previous["train"])
    if "algorithm" in stored:  # runs written before config.toml resolved every parameter
        algorithm = make_algorithm(str(stored["algorithm"]), stored.get("params") or {})
        stored["params"] = tomllib.loads(tomli_w.dumps(algorithm.resolved_params()))
    for name, value in server.config.to_dict().items():  # settings added since it started
        if name not in stored and value == TrainConfig.__dataclass_fields__[name].default:
            stored[name] = value
    if stored != config["train"] or previous.get("sites") != config["sites"]:
        raise ConfigError(
            f"--resume: the settings differ from the run in {run.path} "
            "(config.toml); resume with the same sites and options"
        )


def _check_same_init(server: Coordinator, previous: dict[str, Any]) -> None:
    """A resumed run starts from the weights it started from: their hash must match."""
    before = previous.get("init")
    before_hash = before.get("sha256") if isinstance(before, dict) else None
    report = server.init_report
    now = report.sha256 if report else None
    if before_hash != now:
        source = report.source if report else "random weights"
        raise ConfigError(
            f"--resume: the starting weights ({source}) are not those the run in "
            f"{server.run.path} started from (config.toml [init] sha256 "
            f"{before_hash or 'none'}, now {now or 'none'}); restore the --init file the "
            "run started from, or train again into a new --out"
        )


def restore(server: Coordinator, latest: Path) -> tuple[dict[str, State], int]:
    """The checkpoint in ``latest`` made the server's global state (and what each site holds
    of it, with delta encoding), once its tensors fit the model; its states and round."""
    states, meta = server.store.load(latest)
    done = int(meta["round"])
    fix = damaged_fix(latest)
    if done > server.config.rounds:
        raise RunDirError(
            f"{latest / 'state.json'}: round {done} is past the run's last round "
            f"({server.config.rounds} in config.toml); {fix}"
        )
    against = "the model config.toml describes"
    expected = {k: v.cpu() for k, v in server.global_state.items()}
    named = {"global": expected} | dict.fromkeys(server.held_states(), expected)
    for name, want in named.items():
        path = latest / f"{name}.safetensors"
        if name not in states:
            raise RunDirError(f"{path}: missing; the checkpoint is incomplete; {fix}")
        check_tensors(path, states[name], want, fix, against)
    server.adopt(states, latest)
    return states, done


def save_checkpoint(
    server: Coordinator, round_: int, site_states: dict[str, State] | None = None
) -> None:
    """The global state after ``round_`` (with what each site holds of it, with delta
    encoding) and the sites' own states."""
    states = {"global": server.global_state, **(site_states or {}), **server.held_states()}
    server.store.save(round_, states)
