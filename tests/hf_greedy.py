"""Greedy decoding with `transformers` (run by .venv-vllm's interpreter): the
reference the real-vLLM tests compare against, computed without vLLM.

stdin: {"model_dir": DIR, "output_tokens": N, "conversations": [[first prompt, new
tokens of round 2, new tokens of round 3, ...], ...]} (token ids). Round k's prompt
is round k-1's prompt + its output + the new tokens. stdout: the outputs, one list
of N token ids per round, per conversation. No EOS stop (the servers get
`ignore_eos`), float32, no KV cache: every step recomputes the whole sequence.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def main() -> None:
    job = json.load(sys.stdin)
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32).eval()
    results = []
    for rounds in job["conversations"]:
        prompt, outputs = [], []
        for new in rounds:
            prompt = prompt + (outputs[-1] if outputs else []) + new
            outputs.append(greedy(model, prompt, job["output_tokens"]))
        results.append(outputs)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
