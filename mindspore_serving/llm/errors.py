"""Errors of the LLM engine.

`InvalidRequestError` is what a client did wrong (empty prompt, prompt too long, bad sampling
parameters). It is a ValueError, so plain Python callers can catch it as one, and an
`InvalidInputs` ServingError, so the front ends map it to the INVALID_INPUTS status in their one
error path. The engine keeps serving every other request after rejecting one.
"""

from mindspore_serving.common.errors import InvalidInputs


class InvalidRequestError(InvalidInputs, ValueError):
    """A request the engine refuses to take; the message names the field, the value and the fix."""
