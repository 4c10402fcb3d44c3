"""The formats in which model families write tool calls, by name, and which one a chat template prompts for.

The names are those of the parsers in frontends/llm/tool_calls.py (which reads the calls out of the output) and
the values of the LLM configuration's `model.tool_call_parser`; they live here, below both, so that the
configuration and the worker can name a format without the front ends:

  * "hermes": Hermes, Qwen2, Qwen2.5, Qwen3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
  * "llama3_json": LLaMA 3.1/3.2: the output is `{"name": ..., "parameters": {...}}` (several joined by ";"),
    optionally after `<|python_tag|>`.
"""

HERMES = "hermes"
LLAMA3_JSON = "llama3_json"
TOOL_CALL_PARSERS = (HERMES, LLAMA3_JSON)


def detect_tool_call_parser(template_text: str | None) -> str | None:
    """The format a chat template teaches its model to call tools in, from the template's text: one that writes
    `<tool_call>` is Hermes-style; one that handles `<|python_tag|>` or the `ipython` role (the role LLaMA 3.1
    gives tool results) is LLaMA 3's JSON. None: no known format (a model that calls no tools, or another
    format; `model.tool_call_parser` can still name one)."""
    if not template_text:
        return None
    if "<tool_call>" in template_text:
        return HERMES
    if "<|python_tag|>" in template_text or "ipython" in template_text:
        return LLAMA3_JSON
    return None
