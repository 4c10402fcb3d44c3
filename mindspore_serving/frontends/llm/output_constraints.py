"""The request fields that constrain the output to a grammar, and the one engine constraint they make.

An OpenAI-compatible request can name a constraint in several ways; each becomes the engine's
`structured_output` parameter ({"type", "value"}, llm/sampling_params.py StructuredOutput):

    OpenAI  response_format {"type": "text"}                              no constraint
            response_format {"type": "json_object"}                       json_object
            response_format {"type": "json_schema", "json_schema":
                             {"name", "schema", "strict", "description"}}  json (the schema; none: json_object)
    vLLM    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
            guided_json, guided_regex, guided_choice, guided_grammar       json, regex, choice, grammar

vLLM's options that tune its own grammar backends (guided_decoding_backend, guided_whitespace_pattern,
structured_outputs' disable_any_whitespace, disable_additional_properties, whitespace_pattern) are accepted
and ignored: this engine has one grammar engine. A request may hold one constraint; two are refused naming
both, as vLLM refuses them.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mindspore_serving.common.errors import InvalidParam

Constraint = tuple[str, dict[str, Any]]
"""(the request field that gave it, the engine's structured_output {"type", "value"})."""

GUIDED_FIELDS = (
    ("guided_json", "json"),
    ("guided_regex", "regex"),
    ("guided_choice", "choice"),
    ("guided_grammar", "grammar"),
)


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    """Accepted; the engine always holds the output to the schema."""


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        if self.json_schema is None:
            raise InvalidParam(
                "'response_format.json_schema' is required when 'response_format.type' is 'json_schema'",
                "response_format.json_schema",
            )
        schema = self.json_schema.json_schema
        return {"type": "json_object"} if schema is None else {"type": "json", "value": schema}


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` request field (its StructuredOutputsParams)."""

    model_config = ConfigDict(extra="forbid")
    json_: str | dict[str, Any] | bool | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None

    def constraints(self) -> list[Constraint]:
        found = []
        for name, kind, value in (
            ("json", "json", self.json_),
            ("regex", "regex", self.regex),
            ("choice", "choice", self.choice),
            ("grammar", "grammar", self.grammar),
        ):
            if value is not None:
                found.append((f"structured_outputs.{name}", {"type": kind, "value": value}))
        if self.json_object:
            found.append(("structured_outputs.json_object", {"type": "json_object"}))
        if not found:
            raise InvalidParam(
                "'structured_outputs' needs one of json, regex, choice, grammar or json_object", "structured_outputs"
            )
        return found


def one_constraint(found: list[Constraint]) -> dict[str, Any] | None:
    """The engine's structured_output of the constraints a request gave; InvalidParam naming the first two
    when it gave more than one."""
    if len(found) > 1:
        (first, _), (second, _) = found[:2]
        raise InvalidParam(
            f"'{first}' and '{second}' cannot be used together: a request may constrain its output one way", second
        )
    return found[0][1] if found else None


def request_constraints(
    response_format: ResponseFormat | None, structured_outputs: StructuredOutputs | None, guided: dict[str, Any]
) -> list[Constraint]:
    """Every constraint the fields name; `guided`: the guided_* fields by name (None: not given)."""
    found = []
    if response_format is not None:
        constraint = response_format.constraint()
        if constraint is not None:
            found.append(("response_format", constraint))
    if structured_outputs is not None:
        found.extend(structured_outputs.constraints())
    for name, kind in GUIDED_FIELDS:
        if guided.get(name) is not None:
            found.append((name, {"type": kind, "value": guided[name]}))
    return found
