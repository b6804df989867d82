"""Tiny tokenizers of several families, built here from scratch (no hub): a BPE
vocabulary trained by `tokenizers` on a few sentences, handed to each family's
own transformers class, which sets its normalizer, pre-tokenizer and BOS/EOS
rules as the real checkpoints do."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Speculative decoding is lossless when every drafted token is verified.",
    "Hello world, hello tokenizers! 12345 [user] [assistant] [system]",
]
TEXTS = ["Hello world", "The quick brown fox jumps", " leading space and\nnewline", "12345!"]
MESSAGES = [{"role": "user", "content": "Hello world"}]

_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
                 "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


def _train(byte_level: bool, specials: list[str], vocab_size: int = 300) -> tuple[dict, list]:
    tok = Tokenizer(models.BPE())
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return tok.get_vocab(), [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]


def family_tokenizer(family: str):
    """A transformers tokenizer of `family` with a 300-token vocabulary."""
    from transformers import (
        GemmaTokenizer,
        GPT2Tokenizer,
        LlamaTokenizer,
        PreTrainedTokenizerFast,
        Qwen2Tokenizer,
    )

    if family in ("llama", "llama-eos"):
        vocab, merges = _train(False, ["<unk>", "<s>", "</s>"])
        return LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True,
                              add_eos_token=family == "llama-eos", chat_template=_BOS_TEMPLATE)
    if family == "gemma":
        vocab, merges = _train(False, ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])
        return GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True,
                              chat_template=_BOS_TEMPLATE)
    if family == "qwen2":
        vocab, merges = _train(True, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok = Qwen2Tokenizer(vocab=vocab, merges=merges, chat_template=_CHATML)
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        return tok
    if family == "gpt2":
        vocab, merges = _train(True, ["<|endoftext|>"])
        return GPT2Tokenizer(vocab=vocab, merges=merges)
    if family == "llama3":
        # Llama 3's tokenizer.json carries BOS in a TemplateProcessing post-processor,
        # with no add_bos_token in its config.
        vocab, merges = _train(True, ["<|begin_of_text|>", "<|end_of_text|>"])
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        bos = vocab["<|begin_of_text|>"]
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                       eos_token="<|end_of_text|>", chat_template=_BOS_TEMPLATE)
    raise ValueError(family)


FAMILIES = ("llama", "llama-eos", "gemma", "qwen2", "gpt2", "llama3")


def gguf_bpe_writer(tokenizer, add_bos: bool | None, pre: str = "default",
                    template: str | None = _BOS_TEMPLATE):
    """A `write_tiny_gguf(tokenizer=...)` hook writing a byte-level BPE
    vocabulary as llama.cpp's converter does; `add_bos` None leaves the key out."""
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) for m in json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]]
    special = set(tokenizer.all_special_tokens)

    def write(writer) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3 = CONTROL
        writer.add_token_merges(merges)
        writer.add_bos_token_id(vocab[tokenizer.bos_token])
        writer.add_eos_token_id(vocab[tokenizer.eos_token])
        if add_bos is not None:
            writer.add_add_bos_token(add_bos)
        if template:
            writer.add_chat_template(template)
    return write, len(tokens)


def save_model_dir(folder: Path, tokenizer, seed: int = 0) -> Path:
    """A tiny random Llama with this tokenizer, saved as a transformers folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, initializer_range=0.25, eos_token_id=None,
                      bos_token_id=tokenizer.bos_token_id, pad_token_id=None,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
