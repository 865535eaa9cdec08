"""src/ampd/engines/tiny_model.py's tokenizer carries a chat template, so a vLLM server of the
tiny model answers /v1/chat/completions (issue 15). Rendered with transformers in
the vLLM interpreter (the project's own venv has no transformers)."""

import json
import os
import subprocess

import pytest

from ampd.engines.local_vllm import VLLM_PYTHON
from vllm_servers import ROOT

RENDER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tiny_model
from transformers import AutoTokenizer
tiny_model.write_tokenizer(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
chat = [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7"}, {"role": "user", "content": "w8"}]
text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
print(json.dumps({"text": text, "ids": tokenizer(text, add_special_tokens=False)["input_ids"]}))
"""


def test_the_tiny_tokenizer_renders_a_multi_turn_chat(tmp_path):
    if not VLLM_PYTHON.exists():
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make test` (it builds .venv-vllm), "
                    "or set AMPD_VLLM_PYTHON")
    out = subprocess.run([str(VLLM_PYTHON), "-c", RENDER, str(ROOT / "src" / "ampd" / "engines"), str(tmp_path)], check=True,
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rendered = json.loads(out.stdout.strip().splitlines()[-1])
    assert rendered["text"] == "<s>user: w5 w6\nassistant: w7\nuser: w8\nassistant:"
    # <s> = 1; "user:", "assistant:" are outside the word-level vocabulary (<unk> = 0); wN = N.
    assert rendered["ids"] == [1, 0, 5, 6, 0, 7, 0, 8, 0]
    assert "chat_template" in json.loads((tmp_path / "tokenizer_config.json").read_text())


RENDER_AGENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tiny_model
from transformers import AutoTokenizer
tiny_model.write_tokenizer(sys.argv[2], "bytes")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
tools = [{"type": "function", "function": {"name": "f"}}]
call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "é"}]
text = tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
print(json.dumps({"text": text, "ids": tokenizer(text, add_special_tokens=False)["input_ids"],
                  "decoded": tokenizer.decode(tokenizer("{}é", add_special_tokens=False)["input_ids"]),
                  "think": tokenizer("<think>a</think>", add_special_tokens=False)["input_ids"]}))
"""


def test_the_byte_tokenizer_renders_an_agents_chat_and_spells_any_text(tmp_path):
    """``--tokenizer bytes``: tools, an assistant's tool call and a tool result
    render as the template says; every byte is one token (id 3 + the byte's
    rank in the byte-level alphabet), so JSON and non-ASCII text round-trip;
    the reasoning markers are one token each, after the 3 + 256."""
    out = subprocess.run([str(VLLM_PYTHON), "-c", RENDER_AGENT, str(ROOT / "src" / "ampd" / "engines"), str(tmp_path)], check=True,
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rendered = json.loads(out.stdout.strip().splitlines()[-1])
    assert rendered["text"] == ('<s>tools: [{"type": "function", "function": {"name": "f"}}]\nuser: hi\n'
                                'assistant: <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n'
                                'tool: é\nassistant: ')
    text = rendered["text"]
    assert rendered["ids"][0] == 1 and len(rendered["ids"]) == len(text.encode()) - len("<s>") + 1
    assert all(3 <= i < 3 + 256 for i in rendered["ids"][1:])
    assert rendered["decoded"] == "{}é"
    think, a = rendered["think"], rendered["think"][1]
    assert think == [259, a, 260] and 3 <= a < 259
