"""Writes the Reference pages of the docs site (docs/reference/*.md) from the code: the command-line flags, the
environment variables, the LLM configuration's fields, the servable_config.py DSL and the metrics.

    .venv/bin/python docs/gen_reference.py            # writes the pages (`make docs` runs it before the build)
    .venv/bin/python docs/gen_reference.py --check    # exits 1, naming them, when the written pages are stale

It imports the package (from the environment it runs in) and the two scripts' parsers, never MindSpore.
"""

import argparse
import os
import sys

from reference_gen import cli_page, config_page, dsl_page, env_page, metrics_page
from reference_gen.markdown import GENERATED_NOTE

DOCS = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(DOCS, "reference")

INDEX = (
    GENERATED_NOTE
    + """
# Reference

Generated from the code, so that it says what the code does:

- [Command line](cli.md): every flag of `serve` (`serving_server.py`) and `agent` (`start_agent.py`).
- [Environment variables](env.md): every variable the package reads, with its default.
- [LLM configuration](llm-config.md): every field of an LLM servable's YAML and of the model file it names.
- [servable_config.py and the server API](servable-config.md): the declarations of a servable and the calls
  that serve it.
- [Metrics](metrics.md): every metric on `/metrics`, with its type and labels.
"""
)

PAGES = {
    "index.md": lambda: INDEX,
    "cli.md": cli_page.render,
    "env.md": env_page.render,
    "llm-config.md": config_page.render,
    "servable-config.md": dsl_page.render,
    "metrics.md": metrics_page.render,
}


def render_pages() -> dict[str, str]:
    """{path under docs/reference: the page's text}."""
    return {name: render() for name, render in PAGES.items()}


def stale_pages(pages: dict[str, str]) -> list[str]:
    """The pages whose file is missing or differs from `pages`."""
    stale = []
    for name, text in pages.items():
        path = os.path.join(REFERENCE, name)
        try:
            with open(path, encoding="utf-8") as stream:
                if stream.read() == text:
                    continue
        except FileNotFoundError:
            pass
        stale.append(name)
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report stale pages (exit status 1)")
    args = parser.parse_args(argv)
    missing = env_page.undocumented()
    if missing:
        print(f"environment variables read by the package but not in docs/reference_gen/env_page.py: {missing}")
        return 1
    pages = render_pages()
    stale = stale_pages(pages)
    if args.check:
        if stale:
            print(f"stale reference pages (run .venv/bin/python docs/gen_reference.py): {stale}")
        return 1 if stale else 0
    os.makedirs(REFERENCE, exist_ok=True)
    for name in stale:
        with open(os.path.join(REFERENCE, name), "w", encoding="utf-8") as stream:
            stream.write(pages[name])
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
