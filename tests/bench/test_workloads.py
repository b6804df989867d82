"""The shipped prompt sets load, are well formed, and keep the shape the bench relies on."""
from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from verispec.bench.workloads import WORKLOADS, Prompt, load_workload, parse_workloads

ALL = {name: load_workload(name) for name in WORKLOADS}


@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_loads_with_enough_prompts(name):
    prompts = ALL[name]
    assert len(prompts) >= 20
    assert all(isinstance(p, Prompt) and p.workload == name for p in prompts)
    assert all(p.id.startswith(f"{name}-") for p in prompts)
    assert all(p.source for p in prompts)


@pytest.mark.parametrize("name", WORKLOADS)
def test_messages_are_non_empty_user_turns(name):
    for p in ALL[name]:
        assert p.messages, p.id
        assert p.messages[-1]["role"] == "user", p.id
        assert all(m["content"].strip() for m in p.messages), p.id


def test_ids_are_unique_across_all_workloads():
    ids = [p.id for prompts in ALL.values() for p in prompts]
    assert len(ids) == len(set(ids))


def test_files_hold_exactly_the_documented_fields():
    for name in WORKLOADS:
        path = resources.files("verispec.bench").joinpath("workloads", f"{name}.jsonl")
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            # response_format: the structured workload only (its grammar, docs/workloads.md);
            # prediction: the predicted-edit workload only (the code it edits).
            extra = {"structured": {"response_format"},
                     "predicted-edit": {"prediction"}}.get(name, set())
            assert set(json.loads(line)) == {"id", "workload", "messages", "source"} | extra


def test_summarize_documents_are_long():
    for p in ALL["summarize"]:
        content = p.messages[0]["content"]
        document = content.split("<document>\n", 1)[1].split("\n</document>", 1)[0]
        assert len(document) > 1200, p.id
        instruction = content.split("</document>", 1)[1]
        assert instruction.strip(), f"{p.id}: no instruction after the document"


def test_summarize_mixes_summaries_and_questions():
    instructions = [p.messages[0]["content"].rsplit("</document>", 1)[1] for p in ALL["summarize"]]
    assert sum("answer" in i.lower() or "?" in i for i in instructions) >= 6
    assert sum("summar" in i.lower() for i in instructions) >= 6


def test_code_edit_prompts_contain_code():
    for p in ALL["code-edit"]:
        content = p.messages[0]["content"]
        code = re.search(r"```python\n(.*?)\n```", content, re.S)
        assert code, p.id
        assert re.search(r"^(def|class) \w+", code.group(1), re.M), p.id
        assert 40 <= code.group(1).count("\n") + 1 <= 150, p.id


def test_injected_bugs_are_marked():
    for p in ALL["code-edit"]:
        assert ("bugfix" in p.id) == ("bug injected" in p.source), p.id


def test_humaneval_has_every_problem_in_task_order():
    ids = [p.id for p in ALL["humaneval"]]
    assert ids == [f"humaneval-{i:03d}" for i in range(164)]
    assert all("def " in p.messages[0]["content"] for p in ALL["humaneval"])


def test_limit_takes_the_first_prompts():
    assert [p.id for p in load_workload("chat", limit=5)] == [p.id for p in ALL["chat"][:5]]
    assert len(load_workload("chat", limit=10_000)) == len(ALL["chat"])
    with pytest.raises(ValueError):
        load_workload("chat", limit=0)


def test_unknown_workload_names_the_choices():
    with pytest.raises(ValueError, match="summarize.*code-edit.*humaneval.*creative.*chat"):
        load_workload("mt-bench")


def test_parse_workloads():
    assert parse_workloads("all") == list(WORKLOADS)
    assert parse_workloads("chat, summarize,chat") == ["chat", "summarize"]
    with pytest.raises(ValueError, match="valid|choose"):
        parse_workloads("chat,nope")
    with pytest.raises(ValueError):
        parse_workloads(" , ")


def test_prompts_are_hashable_and_frozen():
    p = ALL["chat"][0]
    assert hash(p) == hash(load_workload("chat", limit=1)[0])
    with pytest.raises(AttributeError):
        p.id = "other"


def test_predicted_edit_predictions_are_the_code_to_edit():
    for p in ALL["predicted-edit"]:
        content = p.messages[0]["content"]
        code = re.search(r"```python\n(.*?)\n```", content, re.S).group(1)
        assert p.prediction == code, p.id
        assert ("rename" in p.id) == ("edit=rename" in p.source), p.id
    assert all(p.prediction is None for name in WORKLOADS if name != "predicted-edit"
               for p in ALL[name])
