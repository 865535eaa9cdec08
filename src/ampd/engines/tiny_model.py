"""Write a tiny, deterministic, random-initialised Llama and its tokenizer.

Run with the vLLM venv (no hub access needed; this file imports nothing of
``ampd``, so that venv needs no ``ampd``; ``ampd.engines.local_vllm.write_tiny_model``
runs it so)::

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python src/ampd/engines/tiny_model.py DIR [--seed 0]

The model is for exercising real vLLM servers on CPU, not for text: its
weights are random but its logits are made *peaky* (a scaled ``lm_head``) so
greedy decoding has clear argmax margins and gives the same tokens whether the
KV cache was computed locally or loaded from another server. Serve it with
``--dtype float32``. The tokenizer is a fixed word-level vocabulary
(``<unk>``, ``<s>``, ``</s>``, then ``w3`` .. ``w{V-1}``), so it needs no
training data. Its chat template (``CHAT_TEMPLATE``, saved with the tokenizer)
lets vLLM serve ``/v1/chat/completions``: recent transformers refuse to guess
a default template.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

VOCAB_SIZE = 2048
HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 2  # head_dim 64, a size every CPU attention kernel supports
INTERMEDIATE_SIZE = 384
MAX_POSITIONS = 4096
INIT_RANGE = 0.08
LM_HEAD_SCALE = 8.0
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# The byte tokenizer's reasoning markers, one token each (ids 259, 260), as vLLM's deepseek_r1
# reasoning parser requires of a vocabulary; ordinary (not special) tokens, so they stay in text.
THINK_TOKENS = ("<think>", "</think>")
# One line per message, "role: content", after the BOS token; the generation prompt
# opens the assistant's line. Words outside the vocabulary (roles, English) are <unk>:
# the model is for exercising servers, not for text.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tokenizer():
    """A word-level fast tokenizer over a fixed vocabulary of VOCAB_SIZE ids, with
    ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), VOCAB_SIZE)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return _fast_tokenizer(core, CHAT_TEMPLATE)


def _fast_tokenizer(core, chat_template: str):
    """``core`` (a ``tokenizers.Tokenizer``) as a transformers fast tokenizer
    with ``SPECIAL_TOKENS`` and ``chat_template``."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=MAX_POSITIONS,
        chat_template=chat_template,
    )


# The byte-level tokenizer's template (``--tokenizer bytes``): agents' chats as vLLM renders
# them. A ``tools: <JSON>`` line when the request has tools; one ``<role>: <content>`` line a
# message, an assistant's tool calls after its content as
# ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (vLLM hands a template the arguments
# as an object or as the client's string: either is written as JSON once); the reply after
# ``assistant: ``. Newlines are written as expressions: transformers renders templates with
# ``trim_blocks``, which drops a newline that follows a block tag.
AGENT_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}tools: {{ tools | tojson }}{{ '\\n' }}{% endif %}"
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}<tool_call>{\"name\": {{ call['function']['name'] | tojson }}, "
    "\"arguments\": {% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}}</tool_call>{% endfor %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
TOKENIZERS = ("words", "bytes")


def build_byte_tokenizer():
    """A byte-level BPE fast tokenizer with no merges: every UTF-8 byte one
    token (ids 3..258 after ``<unk>``, ``<s>``, ``</s>``), so any text, JSON
    included, can be spelled and structured outputs can be enforced on it;
    then ``THINK_TOKENS``; ``AGENT_CHAT_TEMPLATE``. Built offline: no training
    data."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({char: len(SPECIAL_TOKENS) + i for i, char in enumerate(sorted(alphabet))})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = _fast_tokenizer(core, AGENT_CHAT_TEMPLATE)
    tokenizer.add_tokens(list(THINK_TOKENS))
    return tokenizer


def write_tokenizer(out_dir: Path, kind: str = "words") -> None:
    """Save the tokenizer (``build_tokenizer()``, or ``build_byte_tokenizer()``
    for ``kind`` "bytes") to ``out_dir``, its chat template inside
    tokenizer_config.json (not a separate chat_template.jinja), where every
    reader of the model, older transformers included, looks for it."""
    tokenizer = build_byte_tokenizer() if kind == "bytes" else build_tokenizer()
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)


def build_model(seed: int):
    """A random Llama with a scaled lm_head (peaky logits), float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    return model


def greedy_check(
    model, prompt_ids: list[int], num_tokens: int
) -> tuple[list[int], float]:
    """Greedy continuation and its smallest top-1 minus top-2 logit margin.

    Raises SystemExit when the output is one repeated token.
    """
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, len(prompt_ids) :].tolist()
    if len(set(new)) < 2:
        raise SystemExit(f"degenerate greedy output {new}: change the seed")
    margins = [float(t[0].topk(2).values.diff().abs()) for t in out.logits]
    return new, min(margins)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="words",
                        help="words: w3..w2047 (exact lengths); bytes: byte-level, spells JSON (agents, tools)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(args.seed)
    model.save_pretrained(args.out_dir, safe_serialization=True)
    write_tokenizer(args.out_dir, args.tokenizer)
    prompt = [(7 * i + 3) % (VOCAB_SIZE - 3) + 3 for i in range(40)]
    tokens, margin = greedy_check(model, prompt, 16)
    print(f"greedy check: {tokens} (smallest top-2 logit margin {margin:.3f})")
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
