"""What every protocol does with a request before generating: parse the JSON body into the protocol's
pydantic model, pick the served model, and check the sampling parameters the way the engine will."""

import uuid
from typing import TypeVar

import orjson
import pydantic

from mindspore_serving.common import errors
from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.master.llm_types import LlmBackend, ModelInfo

Model = TypeVar("Model", bound=pydantic.BaseModel)

_VALUE_ERROR_PREFIX = "Value error, "


def new_request_id() -> str:
    return uuid.uuid4().hex


def _field_name(loc) -> str:
    return ".".join(str(part) for part in loc) or "body"


def describe(error: pydantic.ValidationError, unknown_field: str) -> InvalidParam:
    """One readable message for a pydantic error; `unknown_field` is a format string with {name}."""
    messages = []
    first = None
    for item in error.errors(include_url=False):
        name = _field_name(item["loc"])
        first = first or name
        if item["type"] == "extra_forbidden":
            messages.append(unknown_field.format(name=name))
        elif item["type"] == "value_error":  # our validators' messages name the field already
            messages.append(
                item["msg"][len(_VALUE_ERROR_PREFIX) :] if item["msg"].startswith(_VALUE_ERROR_PREFIX) else item["msg"]
            )
        elif item["type"] == "missing":
            messages.append(f"`{name}` is required")
        else:
            messages.append(f"`{name}`: {item['msg']}")
    return InvalidParam("; ".join(messages), first)


def load_json(body: bytes) -> dict:
    """The request body as a JSON object; InvalidParam when it is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidParam(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidParam(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def parse_body(body: bytes, model: type[Model], unknown_field: str = "unknown field `{name}`") -> Model:
    """The request body as `model`; InvalidParam (a validation error) when it is not."""
    data = load_json(body)
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise describe(exc, unknown_field) from None


def served_model(backend: LlmBackend, name: str | None) -> ModelInfo:
    """The ModelInfo of `name`, or of the only model served when `name` is None. A model this server serves
    whose worker is down for now is unavailable (503, retry later); only a name it does not serve is unknown."""
    models = backend.models()
    if models and name is None:
        if len(models) > 1:
            raise InvalidParam(
                f"several language models are served ({', '.join(m.name for m in models)}); this "
                f"route serves one: start the server with a default model, or use "
                f"/models/{{model}}/generate or the OpenAI routes, which name the model"
            )
        return models[0]
    for info in models:
        if info.name == name:
            return info
    down = backend.unavailable_models()
    if name in down:
        raise errors.WorkerUnavailable(down[name])
    if name is None and down:
        raise errors.WorkerUnavailable(next(iter(down.values())))
    if not models and not down:
        raise errors.WorkerUnavailable("no language model is being served at the moment")
    raise errors.ServableUnavailable(
        f"The model `{name}` does not exist; served language models: {', '.join([m.name for m in models] + list(down))}"
    )


def sampling_params(**values) -> dict[str, object]:
    """The engine's sampling parameters (None values left out, so the engine's defaults apply), checked now
    so that a bad value is rejected before any generation starts."""
    params = {k: v for k, v in values.items() if v is not None}
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    SamplingParams.from_dict(params)  # raises InvalidRequestError (an InvalidInputs) naming the field
    return params


def stop_list(stop, max_count: int, field: str = "stop") -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > max_count:
        raise InvalidParam(f"`{field}` supports up to {max_count} stop sequences. Given: {len(stops)}", field)
    return stops or None
