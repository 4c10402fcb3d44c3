"""vLLM's `POST /tokenize` and `POST /detokenize`: what the model gets for a prompt or a chat, and back.

    POST /tokenize    {"model", "prompt", "add_special_tokens": true}
                      or {"model", "messages", "add_generation_prompt": true, "continue_final_message": false,
                          "add_special_tokens", "tools", "documents", "chat_template_kwargs"}
                      (either with "return_token_strs")
                      -> {"count", "max_model_len", "tokens": [ids], "token_strs": [...] | null}
    POST /detokenize  {"model", "tokens": [ids]} -> {"prompt": text}

"model" may be left out when one language model is served. Chat messages go through the model's chat template,
and the ids are those a generation of the same input gets (a chat's text without the tokenizer's special
tokens unless "add_special_tokens" says otherwise: the template writes BOS itself). Errors are OpenAI's.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.errors import Protocol
from mindspore_serving.frontends.llm.params import load_json, parse_body, served_model
from mindspore_serving.frontends.llm.responses import guarded
from mindspore_serving.frontends.llm.schemas_openai import UNKNOWN_FIELD, ContentPart
from mindspore_serving.master.llm_types import LlmBackend, TokenizeRequest

PROTOCOL = Protocol.OPENAI
MAX_TOKEN_ID = 2**31 - 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    return_token_strs: bool | None = False


class TokenizePromptBody(_Body):
    prompt: str
    add_special_tokens: bool = True


class TokenizeMessage(BaseModel):
    """A chat message as the chat template gets it: role and content, and any other field (tool_calls, name,
    tool_call_id, ...) as sent. Text parts of a content are joined, as /v1/chat/completions does."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def as_dict(self, index: int) -> dict[str, Any]:
        message = self.model_dump(exclude={"content"})  # role and the other fields
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise InvalidParam(
                        f"'messages.{index}.content' parts of type {part.type!r} are not supported; send text parts",
                        f"messages.{index}.content",
                    )
                texts.append(part.text)
            content = "".join(texts)
        message["content"] = content
        return message


class TokenizeChatBody(_Body):
    messages: list[TokenizeMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    """None: as a generation of these messages tokenizes them."""
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None

    def check(self):
        if self.chat_template is not None:
            raise InvalidParam(
                "'chat_template' is not accepted: the model's own chat template is used", "chat_template"
            )


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[Annotated[int, Field(strict=True, ge=0, le=MAX_TOKEN_ID)]]


def tokenize_request(raw: bytes) -> TokenizeRequest:
    """The TokenizeRequest of a /tokenize body (a prompt, or chat messages); InvalidParam when it is not one.
    Its model is the body's, "" when it names none."""
    chat = "messages" in load_json(raw)
    body = parse_body(raw, TokenizeChatBody if chat else TokenizePromptBody, UNKNOWN_FIELD)
    model = body.model or ""
    strs = bool(body.return_token_strs)
    if not chat:
        return TokenizeRequest(
            model, prompt=body.prompt, add_special_tokens=body.add_special_tokens, return_token_strs=strs
        )
    body.check()
    return TokenizeRequest(
        model,
        messages=[m.as_dict(i) for i, m in enumerate(body.messages)],
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        add_special_tokens=body.add_special_tokens,
        tools=body.tools,
        documents=body.documents,
        chat_template_kwargs=body.chat_template_kwargs,
        return_token_strs=strs,
    )


def build_tokenize_router(backend: LlmBackend) -> APIRouter:
    router = APIRouter(tags=["vLLM"])

    @router.post("/tokenize", summary="Token ids of a prompt or of chat messages (vLLM)")
    @guarded(PROTOCOL)
    async def tokenize(request: Request):
        tokenize_input = tokenize_request(await request.body())
        model = served_model(backend, tokenize_input.model or None)
        tokenize_input.model = model.name
        result = await backend.tokenize(tokenize_input)
        return {
            "count": len(result.token_ids),
            "max_model_len": model.max_model_len,
            "tokens": result.token_ids,
            "token_strs": result.token_strs,
        }

    @router.post("/detokenize", summary="Text of token ids (vLLM)")
    @guarded(PROTOCOL)
    async def detokenize(request: Request):
        body = parse_body(await request.body(), DetokenizeBody, UNKNOWN_FIELD)
        model = served_model(backend, body.model)
        return {"prompt": await backend.detokenize(model.name, body.tokens)}

    return router
