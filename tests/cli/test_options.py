"""Every parameter of the commands below is declared ``Annotated[T, typer.Option(...)]`` (or ``typer.Argument``),
options keyword-only, and every optional one's help says how its default is chosen (STYLE.md, "The command
line"). A new ``x: int = typer.Option(1, ...)`` fails here."""

from __future__ import annotations

import inspect
import typing

import pytest
import typer.models

from kvplan.cli import app

# the modules whose commands follow the rule: every command module
MODULES = ("size", "models", "examples", "fit", "gpus", "explain", "validate", "engines", "simulate", "schema",
           "check")


def _commands() -> list[typer.models.CommandInfo]:
    found = [c for c in app.registered_commands if c.callback.__module__.rsplit(".", 1)[-1] in MODULES]
    assert {c.callback.__module__.rsplit(".", 1)[-1] for c in found} == set(MODULES)
    return found


def _name(command: typer.models.CommandInfo) -> str:
    return command.name or command.callback.__name__


@pytest.mark.parametrize("command", _commands(), ids=_name)
def test_every_parameter_is_annotated_and_every_option_keyword_only(command):
    hints = typing.get_type_hints(command.callback, include_extras=True)
    for name, param in inspect.signature(command.callback).parameters.items():
        bare = isinstance(param.default, typer.models.ParameterInfo)
        assert not bare, f"{_name(command)}: {name} = typer.Option(...)"
        hint = hints[name]
        assert typing.get_origin(hint) is typing.Annotated, f"{_name(command)}: {name} is not Annotated"
        infos = [m for m in hint.__metadata__ if isinstance(m, typer.models.ParameterInfo)]
        assert len(infos) == 1, f"{_name(command)}: {name} has no typer.Option or typer.Argument"
        if isinstance(infos[0], typer.models.OptionInfo):
            assert param.kind is inspect.Parameter.KEYWORD_ONLY, f"{_name(command)}: option {name} is positional"


@pytest.mark.parametrize("command", _commands(), ids=_name)
def test_every_optional_parameter_says_how_its_default_is_chosen(command):
    hints = typing.get_type_hints(command.callback, include_extras=True)
    for name, param in inspect.signature(command.callback).parameters.items():
        if param.default is inspect.Parameter.empty:
            continue  # a required argument has no default to explain
        (info,) = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, typer.models.ParameterInfo)]
        assert "default" in (info.help or "").lower(), f"{_name(command)}: --{name}'s help names no default"
