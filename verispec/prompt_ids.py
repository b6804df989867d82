"""Text becomes prompt ids here and nowhere else: the API, the server, the
benchmarks and training all call these, so every edge gives the model the
prompt transformers and llama.cpp would give it.

- Raw text gets the special tokens the tokenizer's own encoding adds
  (`add_special_tokens=True`): BOS where its config says `add_bos_token`, EOS
  where it says `add_eos_token`, nothing for tokenizers that add neither. A
  GGUF file's tokenizer is built from `tokenizer.ggml.add_bos_token` /
  `add_eos_token` (see `models.loading.gguf_tokenizer`), which is what
  llama.cpp reads.
- A chat template writes its own special tokens (a `{{ bos_token }}` at its
  start, say), so its text is tokenized without adding any: never a second BOS.
  This is transformers' `apply_chat_template(tokenize=True)`.
- Token-id prompts never pass through here: they are the model's input as given.
"""
from __future__ import annotations

from typing import Sequence


def text_ids(tokenizer, text: str) -> list[int]:
    """The ids of a raw prompt, with the special tokens its tokenizer adds."""
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer; pass token ids")
    if not text or not text.strip():
        raise ValueError("the prompt is empty")
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=True)]


def prediction_ids(tokenizer, text: str) -> list[int]:
    """The ids of a predicted output (Predicted Outputs): text the answer is expected to
    contain, tokenized as it would appear there, so with no special tokens added."""
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer; pass the prediction as token ids")
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def template_text_ids(tokenizer, text: str) -> list[int]:
    """The ids of text a chat template rendered: its special tokens are already in it."""
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def chat_ids(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
    """The ids of a conversation through the tokenizer's chat template, the assistant's
    turn opened; `tools` (OpenAI's function list) for a template that writes them."""
    if not messages:
        raise ValueError("the messages are empty")
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer; pass token ids")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template")
    extra = {"tools": list(tools)} if tools else {}
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                        **extra)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if len(ids) and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return [int(i) for i in ids]
