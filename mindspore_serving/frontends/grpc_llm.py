"""MSService.PredictStream: token streaming for LLM servables over the public gRPC API.

The request holds one instance with `prompt` (or `inputs`) and optional sampling fields. Each reply holds
one instance: per token `token_id`, `text`, `index`; the last one `finished` = True with `text`,
`token_ids`, `finish_reason`, `prompt_tokens` and `completion_tokens`. An error ends the stream with a
reply carrying one error_msg; a full engine queue ends the call with status RESOURCE_EXHAUSTED.
"""

import grpc
import numpy as np

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import proto_to_instance
from mindspore_serving.frontends.errors import grpc_error
from mindspore_serving.frontends.replies import error_reply, stream_reply
from mindspore_serving.llm.instance_params import prompt_of, sampling_params_of
from mindspore_serving.master.llm_types import FinalEvent, GenerationRequest


async def predict_stream(backend, request):
    spec = request.servable_spec
    if len(request.instances) != 1:
        yield error_reply(
            spec, errors.InvalidInputs(f"PredictStream takes exactly one instance, got {len(request.instances)}")
        )
        return
    try:
        instance = proto_to_instance(request.instances[0])
        prompt = prompt_of(instance)
        params = sampling_params_of(instance)
    except KeyError:
        yield error_reply(spec, errors.InvalidInputs("Cannot find input prompt (or inputs) in instance input"))
        return
    except Exception as err:
        yield error_reply(spec, errors.InvalidInputs(str(err)))
        return
    generation = GenerationRequest(model=spec.name, prompt=prompt, params=params)
    try:
        async for event in backend.stream(generation):
            if isinstance(event, FinalEvent):
                yield stream_reply(
                    spec,
                    {
                        "finished": np.bool_(True),
                        "text": event.text,
                        "token_ids": np.asarray(event.token_ids, np.int32),
                        "finish_reason": event.finish_reason,
                        "prompt_tokens": np.int32(event.prompt_tokens),
                        "completion_tokens": np.int32(event.completion_tokens),
                    },
                )
            else:
                yield stream_reply(
                    spec, {"token_id": np.int32(event.token_id), "text": event.text, "index": np.int32(event.index)}
                )
    except errors.ServingError as err:
        if grpc_error(err)[0] is not grpc.StatusCode.OK:
            raise  # the servicer ends the call with that status (back-pressure, as gRPC clients expect)
        yield error_reply(spec, err)
