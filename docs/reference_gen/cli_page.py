"""The command-line reference: every flag of each `mindspore-serving` command (`serve`, the same as
`serving_server.py`; `agent`, the same as `start_agent.py`), read from the argparse parser the command builds
(`build_parser` of its module in `mindspore_serving/cli/`)."""

import argparse
import inspect

from mindspore_serving import cli
from reference_gen.markdown import GENERATED_NOTE, cell, code, fence, table

SCRIPTS = {"serve": "serving_server.py", "agent": "start_agent.py"}  # the MindSpore Serving-style scripts
# build_parser arguments that depend on where the command runs, given as the documentation shows them
PLACEHOLDERS = {"servable_directory": "servables"}


def command_parsers() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(command, its one-line summary, its parser) of each command."""
    commands = []
    for name, summary in cli.COMMANDS.items():
        build = inspect.getmodule(cli.command_main(name)).build_parser
        kwargs = {p: v for p, v in PLACEHOLDERS.items() if p in inspect.signature(build).parameters}
        commands.append((name, summary, build(prog=f"{cli.PROG} {name}", **kwargs)))
    return commands


def _flag(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or action.dest
    if action.nargs == 0:
        return code(names)
    if action.choices:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.metavar or (action.dest.upper() if action.option_strings else "")
    return code(f"{names} {value}".strip())


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or value == [] or (action.nargs == 0 and value is False):
        return ""
    return code(repr(value) if value == "" else value)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:
        text = parser._get_formatter()._expand_help(action)
    notes = []
    if action.required:
        notes.append("required")
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        notes.append("repeatable")
    return cell(text + (f" ({', '.join(notes)})" if notes else ""))


def _groups(parser: argparse.ArgumentParser):
    for group in parser._action_groups:
        # hidden flags (help=SUPPRESS: internal ones, removed ones kept only to be refused) are not documented
        actions = [
            a
            for a in group._group_actions
            if not isinstance(a, argparse._HelpAction) and a.help is not argparse.SUPPRESS
        ]
        if actions:
            yield group, actions


def _command_section(name: str, summary: str, parser: argparse.ArgumentParser) -> str:
    script = SCRIPTS.get(name)
    parts = [f"## {cli.PROG} {name}\n", cell(summary[:1].upper() + summary[1:]) + "."]
    if script:
        parts[-1] += f" `python {script}` takes the same flags."
    parts[-1] += "\n"
    if parser.description:
        parts.append(fence(parser.description))
    for group, actions in _groups(parser):
        if group.title not in ("options", "optional arguments", "positional arguments"):
            parts.append(f"### {group.title}\n")
            if group.description:
                parts.append(cell(group.description) + "\n")
        rows = ([_flag(a), _default(a), _help(parser, a)] for a in actions)
        parts.append(table(["flag", "default", "meaning"], rows))
    return "\n".join(parts)


def render() -> str:
    parts = [
        GENERATED_NOTE,
        "# Command line\n",
        f"The `{cli.PROG}` command runs one of {', '.join(f'`{n}`' for n in cli.COMMANDS)}, each with its own "
        f"flags: `{cli.PROG} COMMAND --help` lists them, as below.\n",
    ]
    parts += [_command_section(*command) for command in command_parsers()]
    return "\n".join(parts)
