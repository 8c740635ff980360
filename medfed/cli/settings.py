"""Training settings on the command line: one option per setting, built from its declaration in
:class:`medfed.config.TrainConfig` (option name, help, default), and the settings a command
takes from the options the user gave."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError

# A setting's type (its annotation, a string) -> the type of its option; repeatable options
# gather a table (params: NAME=VALUE) or a list (faults).
OPTION_TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "float | None": float,
    "str": str,
    "bool": bool,
    "dict[str, Any]": list[str],
    "tuple[str, ...]": list[str],
}


def option_settings() -> list[dataclasses.Field]:
    """The training settings a command-line option sets, in declaration order."""
    return [spec for spec in dataclasses.fields(TrainConfig) if spec.metadata["option"]]


def option_help(spec: dataclasses.Field, config: str, from_config: bool) -> str:
    """A setting's declared help, with its default and the option naming a settings file
    (``config``) filled in; ``from_config``: that file's setting comes before the default."""
    phrase = f"{config}'s, else {spec.default}" if from_config else f"{spec.default}"
    text = spec.metadata["help"].replace("{default}", f"(default: {phrase})")
    return text.replace("{config}", config)


# The part of a command's help that lists the training settings.
SETTINGS_PANEL = "Training settings"


def _parameter(spec: dataclasses.Field, help: str) -> inspect.Parameter:
    """The keyword parameter typer turns into the setting's option; None: not given."""
    option = spec.metadata["option"]
    # Without names of its own, typer names the option after the parameter and gives a flag
    # its --no- form too.
    names = () if option == "--" + spec.name.replace("_", "-") else (option,)
    kind = OPTION_TYPES[str(spec.type)]
    annotation = Annotated[
        kind | None, typer.Option(*names, help=help, rich_help_panel=SETTINGS_PANEL)
    ]
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=None)  # fmt: skip


def training_options(
    *names: str, config: str, from_config: bool = False, help: Mapping[str, str] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one option for each named training setting (every setting with an option
    when none is named), in place of its ``settings`` parameter, which then receives
    {setting: value as given, or None}. ``help``: a command's own words for a setting."""
    specs = [s for s in option_settings() if not names or s.name in names]
    unknown = set(names) - {s.name for s in specs}
    if unknown:
        raise ValueError(f"no training setting with an option: {sorted(unknown)}")
    own = dict(help or {})

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        params = []
        for param in inspect.signature(func, eval_str=True).parameters.values():
            if param.name != "settings":
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
                continue
            for spec in specs:
                words = own.get(spec.name) or option_help(spec, config, from_config)
                params.append(_parameter(spec, words))

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            settings = {spec.name: kwargs.pop(spec.name, None) for spec in specs}
            return func(**kwargs, settings=settings)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def parse_params(items: list[str]) -> dict[str, str]:
    """``--param NAME=VALUE`` options as a table; each name once."""
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise ConfigError(f"--param {item!r} must be NAME=VALUE, e.g. --param lam=0.8")
        if key in params:
            raise ConfigError(
                f"--param {key} is given twice ({key}={params[key]} and {key}={value}); "
                "give each parameter once"
            )
        params[key] = value
    return params


def _init_source(text: str) -> str:
    """--init as the run records it: a path made absolute (so resuming from elsewhere finds
    it), a ``torchvision:NAME`` as given."""
    if not text.strip():
        # An empty --init (an unset shell variable) would start from random weights, as if
        # it had been left out: said, not guessed.
        raise ConfigError(
            "--init is empty: name the starting weights (a finished run's folder, a "
            ".safetensors or state-dict file, torchvision:resnet18), or leave --init out to "
            "start from random weights"
        )
    if text.startswith("torchvision:"):
        return text
    return str(Path(text).expanduser().resolve())


# How a given option's value becomes the setting's value.
CONVERT: dict[str, Callable[[Any], Any]] = {
    "params": parse_params,
    "faults": tuple,
    "init": _init_source,
}


def given_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings whose options the user gave (typer leaves the others None), converted:
    these override a stored config.toml's."""
    given = {}
    for name, value in settings.items():
        if value is None or (isinstance(value, list) and not value):
            continue
        given[name] = CONVERT[name](value) if name in CONVERT else value
    return given
