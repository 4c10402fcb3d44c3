"""The docs site's Reference pages are generated from the code (docs/gen_reference.py): they must be what the
generator writes now, and the hand-kept table of environment variables must list every variable the package
reads, and nothing it no longer reads."""

import importlib
import pathlib
import sys
import textwrap

import pytest

from mindspore_serving.common.metrics import FAMILIES
from mindspore_serving.llm.config import SchedulerConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def gen():
    sys.path.insert(0, str(DOCS))
    try:
        yield importlib.import_module("gen_reference")
    finally:
        sys.path.remove(str(DOCS))


@pytest.fixture(scope="module")
def pages(gen):
    return gen.render_pages()


@pytest.fixture(scope="module")
def env_page(gen):
    return importlib.import_module("reference_gen.env_page")


def test_reference_pages_are_current(gen, pages):
    stale = gen.stale_pages(pages)
    assert not stale, f"docs/reference/{stale} differ from the code: run .venv/bin/python docs/gen_reference.py"


def test_every_environment_variable_read_is_documented(env_page):
    assert env_page.undocumented() == []


def test_no_documented_variable_is_gone_from_the_code(env_page):
    assert env_page.stale() == []


def test_variables_found_through_constants_and_helpers(env_page, tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    source = """
        import os
        NAME = "MY_DIRECT"
        SPIN = "MY_SPIN"

        def f(environ=None):
            os.environ.get("MY_LITERAL")
            os.getenv(NAME)
            environ["MY_SUBSCRIPT"]
            duration_seconds(SPIN, 1.0, "seconds")
            os.environ["MY_WRITTEN"] = "1"
        PREFIX = "MS_SERVING_NEW_TLS"
    """
    (package / "mod.py").write_text(textwrap.dedent(source))
    read, literals = env_page.variables_in_code(str(package))
    assert read == {"MY_LITERAL", "MY_DIRECT", "MY_SUBSCRIPT", "MY_SPIN"}
    assert literals == {"MS_SERVING_NEW_TLS"}
    assert "MS_SERVING_NEW_TLS" in env_page.undocumented(str(package))


def test_every_metric_and_yaml_field_is_on_its_page(pages):
    assert all(f"`{name}`" in pages["metrics.md"] for name in FAMILIES)
    assert all(f"`{name}`" in pages["llm-config.md"] for name in SchedulerConfig.__dataclass_fields__)
