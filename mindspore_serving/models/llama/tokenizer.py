"""A thin wrapper over any `tokenizers` tokenizer.json: encode/decode plus the bos/eos/pad ids.

Special ids come, in this order of precedence, from explicit arguments (e.g. a model config's
bos_token_id/eos_token_id/pad_token_id), from a `tokenizer_config.json` next to the tokenizer.json (the usual
layout of a Hugging Face model directory), or from the tokenizer's own added special tokens with a common name
(`</s>`, `<|endoftext|>`, `<eos>`, ...). A tokenizer without an eos token is accepted: eos_id is then None and
generation stops on max_new_tokens or stop strings only.

The same directory gives the model's chat template, as Hugging Face keeps it: `chat_template.jinja`, else
tokenizer_config.json's `chat_template` (a string, or a list of named templates); and the special tokens'
texts a template is given (`special_tokens`: bos_token, eos_token, ...).
"""

import json
import os
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer

BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[CLS]")
EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[SEP]")
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""tokenizer_config.json's special tokens, which HF hands to chat templates under these names."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def _token_name(value) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as {"content": ...} objects."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class TextTokenizer:
    """encode(text) -> ids, decode(ids) -> text, and bos_id / eos_id / pad_id (None when absent)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        config_dir: str | None = None,
    ):
        self.tokenizer = tokenizer
        config = self._read_config(config_dir) if config_dir else {}
        names = {key: _token_name(config.get(key)) for key in SPECIAL_TOKEN_KEYS}
        added = tokenizer.get_added_tokens_decoder()
        special = {t.content for t in added.values() if t.special}
        self.special_ids = frozenset(token_id for token_id, t in added.items() if t.special)
        """Ids of the special tokens (EOS and the like): TGI flags them in its token details."""
        self.bos_id = bos_id if bos_id is not None else self._find(names.get("bos_token"), BOS_NAMES, special)
        self.eos_id = eos_id if eos_id is not None else self._find(names.get("eos_token"), EOS_NAMES, special)
        self.pad_id = pad_id if pad_id is not None else self._find(names.get("pad_token"), PAD_NAMES, special)
        for name, value in (("bos_id", self.bos_id), ("eos_id", self.eos_id), ("pad_id", self.pad_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value} is outside the tokenizer's vocabulary of {self.vocab_size} ids")
        self.special_tokens = self._special_tokens(names, config.get("additional_special_tokens"))
        """The special tokens' texts by HF's names (bos_token, eos_token, ...), as chat templates get them."""
        self.chat_template = self._chat_template(config_dir, config.get("chat_template"))
        """The model's chat template: a string, HF's list of named templates, or None (the model has none)."""

    @classmethod
    def from_file(
        cls, path: str, bos_id: int | None = None, eos_id: int | None = None, pad_id: int | None = None
    ) -> "TextTokenizer":
        """Loads a tokenizer.json file, or a directory holding tokenizer.json (and maybe tokenizer_config.json)."""
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as err:  # the Rust library raises a bare Exception on a malformed file
            raise ValueError(f"{path} is not a valid tokenizers JSON file: {err}") from err
        return cls(tokenizer, bos_id, eos_id, pad_id, config_dir=os.path.dirname(os.path.abspath(path)))

    @staticmethod
    def _read_config(directory: str) -> dict:
        path = os.path.join(directory, "tokenizer_config.json")
        if not os.path.isfile(path):
            return {}
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except ValueError as err:
                raise ValueError(f"tokenizer_config.json is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError("tokenizer_config.json must hold a JSON object")
        return data

    def _special_tokens(self, names: dict[str, str | None], additional) -> dict[str, Any]:
        found = {"bos_token": self.bos_id, "eos_token": self.eos_id, "pad_token": self.pad_id}
        tokens: dict[str, Any] = {}
        for key in SPECIAL_TOKEN_KEYS:
            text = names.get(key)
            if text is None and found.get(key) is not None:
                text = self.tokenizer.id_to_token(found[key])
            if text is not None:
                tokens[key] = text
        if isinstance(additional, list):
            tokens["additional_special_tokens"] = [t for t in map(_token_name, additional) if t is not None]
        return tokens

    @staticmethod
    def _chat_template(directory: str | None, configured):
        path = os.path.join(directory, CHAT_TEMPLATE_FILE) if directory else None
        if path and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
        return configured if isinstance(configured, (str, list)) else None

    def _find(self, configured: str | None, candidates: Iterable[str], special: set) -> int | None:
        if configured is not None:
            token_id = self.tokenizer.token_to_id(configured)
            if token_id is not None:
                return token_id
        for name in candidates:
            if name in special:
                return self.tokenizer.token_to_id(name)
        return None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True, add_bos: bool = False) -> list[int]:
        """Token ids of text. add_special_tokens applies the tokenizer's own post-processor (the bundled tiny
        tokenizer's prepends <s>); add_bos makes sure the ids start with bos_id whatever that post-processor does."""
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)
