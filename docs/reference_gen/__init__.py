"""Renders the Reference pages of the docs site (docs/reference/*.md) from the code: the command-line parsers, the
environment variables the package reads, the LLM configuration dataclasses, the servable_config.py DSL and the
metric table. `docs/gen_reference.py` writes them; tests/unit/test_docs_reference.py fails when they are stale."""
