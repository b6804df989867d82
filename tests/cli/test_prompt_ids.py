"""Prompt ids as the model asks: raw text gets the BOS/EOS the tokenizer's own
encoding adds (and llama.cpp's, from a GGUF file's metadata), a chat template's
BOS is never doubled, and token ids pass as given. Checked against
transformers' encoding and llama.cpp's tokenizer on tokenizers of several
families built here, and on the default GGUF."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_support import TinyShape, write_tiny_gguf
from tokenizer_support import (
    FAMILIES,
    MESSAGES,
    TEXTS,
    family_tokenizer,
    gguf_bpe_writer,
    save_model_dir,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from verispec import Engine, SamplingParams, SpecConfig
from verispec.models import loading
from verispec.serving.protocol import ServeDefaults, build_job


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp(request.param), family_tokenizer(request.param))


def _chat_reference(reference) -> list[int]:
    out = reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_every_edge_gives_transformers_ids(family_dir):
    reference = AutoTokenizer.from_pretrained(str(family_dir))
    for backend in ("hf", "native"):
        engine = Engine(str(family_dir), backend=backend, dtype="fp32")
        for text in TEXTS:
            want = reference(text)["input_ids"]
            assert engine.encode(text) == want, (backend, text)
            job = build_job({"model": "m", "prompt": text, "max_tokens": 2}, False, engine,
                            ("m",), ServeDefaults())
            assert job.prompts == [want]
        if reference.bos_token_id is not None and reference.add_bos_token:
            assert engine.encode(TEXTS[0])[0] == reference.bos_token_id
        if reference.chat_template:
            chat = _chat_reference(reference)
            assert engine.encode_messages(MESSAGES) == chat
            assert engine.encode(MESSAGES[0]["content"], chat=True) == chat
            job = build_job({"model": "m", "messages": MESSAGES, "max_tokens": 2}, True, engine,
                            ("m",), ServeDefaults())
            assert job.prompts == [chat]
            if reference.bos_token_id is not None:
                assert chat.count(reference.bos_token_id) <= 1  # the template's, no second one


def test_training_prompts_use_the_same_ids(family_dir):
    from verispec.training.cli import encode_prompts

    class P:
        id, kind, messages = "p", "chat", MESSAGES

    reference = AutoTokenizer.from_pretrained(str(family_dir))
    [ids] = encode_prompts(reference, [P()])
    want = (_chat_reference(reference) if reference.chat_template
            else reference(MESSAGES[-1]["content"])["input_ids"])
    assert ids.tokens == want


def test_raw_prompt_output_equals_transformers_generate(tmp_path):
    """The issue's symptom: with BOS missing, greedy output left transformers' from token 3."""
    folder = save_model_dir(tmp_path, family_tokenizer("llama"))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    reference = AutoTokenizer.from_pretrained(str(folder))
    engine = Engine(str(folder), backend="hf", dtype="fp32")
    for text in TEXTS[:2]:
        ids = reference(text, return_tensors="pt")["input_ids"]
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12, min_new_tokens=12,
                              eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
        for spec in (SpecConfig("none"), SpecConfig("ngram", k=4)):
            got = engine.generate(text, SamplingParams(max_new_tokens=12, ignore_eos=True), spec)
            assert got.token_ids == want
        # Token ids are the model's input as given: no BOS is put in front of them.
        without_bos = ids[0, 1:].tolist()
        short = torch.tensor([without_bos])
        plain = model.generate(short, attention_mask=torch.ones_like(short), do_sample=False,
                               max_new_tokens=6,
                               min_new_tokens=6, eos_token_id=None, pad_token_id=0)
        got = engine.generate(without_bos, SamplingParams(max_new_tokens=6, ignore_eos=True))
        assert got.token_ids == plain[0, len(without_bos):].tolist()


def _llama_cpp_ids(path: Path, text: str) -> list[int] | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return model.tokenize(text.encode(), add_bos=True, special=True)


@pytest.mark.parametrize("add_bos,pre", [(True, "default"), (False, "default"),
                                          (None, "default"), (None, "llama-bpe")])
def test_gguf_prompt_ids_follow_the_metadata(tmp_path, add_bos, pre):
    """tokenizer.ggml.add_bos_token, and llama.cpp's default where a file has none."""
    write, vocab = gguf_bpe_writer(family_tokenizer("llama3"), add_bos, pre)
    path = write_tiny_gguf(tmp_path / "m.gguf", shape=TinyShape(vocab=vocab), eos=None,
                           tokenizer=write)
    asks_bos = add_bos if add_bos is not None else pre == "llama-bpe"
    quant = Engine(str(path), dtype="bf16")
    dense = Engine(str(path), dtype="fp32")
    assert (quant.weights, dense.weights) == (loading.auto_quant_kind() or "dense", "dense")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    for text in TEXTS:
        ids = quant.encode(text)
        assert dense.encode(text) == ids
        assert (ids[0] == reference.bos_token_id) == asks_bos
        if add_bos is not None:  # transformers reads the key; without it, see llama.cpp
            assert ids == reference(text)["input_ids"]
        llama_cpp_ids = _llama_cpp_ids(path, text)
        if llama_cpp_ids is not None:
            assert ids == llama_cpp_ids
    chat = _chat_reference(reference)
    assert quant.encode_messages(MESSAGES) == chat and chat.count(reference.bos_token_id) == 1


def test_default_gguf_prompt_ids(default_engine):
    """SmolLM2's file says add_bos_token false: no BOS, as llama.cpp and transformers agree."""
    gguf = loading.default_gguf_path()
    reference = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quant_tokenizer = loading.gguf_tokenizer(gguf)
    for text in TEXTS:
        want = reference(text)["input_ids"]
        assert default_engine.encode(text) == want
        assert quant_tokenizer.encode(text, add_special_tokens=True) == want
        llama_cpp_ids = _llama_cpp_ids(gguf, text)
        if llama_cpp_ids is not None:
            assert want == llama_cpp_ids
    assert default_engine.encode_messages(MESSAGES) == _chat_reference(reference)
