"""The `mindspore-serving` command: `mindspore-serving serve ...` serves servables and models (what serving_server.py
does, with its flags), `mindspore-serving agent ...` starts the LLM agents of a configuration on this host (what
start_agent.py does). `mindspore-serving COMMAND --help` lists a command's flags.

The package sits above every other one (the import contracts in .importlinter): it only parses flags and calls
the server's API.
"""

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from mindspore_serving import __version__

PROG = "mindspore-serving"
# command -> the line --help shows for it; its module mindspore_serving.cli.<command> has the main (taking argv and
# prog), imported only when the command runs: serving_server.py imports only serve's modules, and the agents only
# agent's
COMMANDS: dict[str, str] = {
    "serve": "serve the servables of a directory and Hugging Face model directories over gRPC and HTTP",
    "agent": "start the LLM agents of a configuration on this host (one process per device rank)",
}


def command_main(name: str) -> Callable[..., None]:
    """The main of command `name` (one of COMMANDS)."""
    main: Callable[..., None] = importlib.import_module(f"{__name__}.{name}").main
    return main


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: the command's name, --help and --version (each command parses its own flags)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n", 1)[0],
        epilog="\n".join(f"  {name:8s}{text}" for name, text in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("command", choices=list(COMMANDS), help="the command to run; its flags follow it")
    return parser


def split_command(argv: Sequence[str]) -> tuple[Callable[..., None], list[str], str]:
    """(the command's main, its own arguments, its prog) of a command line without the program's name; help,
    version and an unknown or missing command exit as argparse does."""
    argv = list(argv)
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        parser.parse_args(argv[:1])  # exits: --help, --version, an unknown command
        parser.error("the command comes first, then its flags")  # e.g. `mindspore-serving --grpc ...`
    return command_main(argv[0]), argv[1:], f"{PROG} {argv[0]}"


def main(argv: Sequence[str] | None = None) -> None:
    """The console entry point."""
    command, args, prog = split_command(sys.argv[1:] if argv is None else argv)
    command(args, prog=prog)
