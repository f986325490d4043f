"""llama.cpp (llama-cpp-python) on the same GGUF and the same prompt token ids
as bench-generate: prompt tokens/s (each prompt read once, one at a time) and
greedy decode tokens/s for one sequence. Prints one JSON object per figure.

    python bench/llama_cpp_baseline.py GGUF PROMPTS.json NEW_TOKENS THREADS
"""
import json
import sys
import time

import numpy as np
from llama_cpp import Llama

gguf, prompts_path, new_tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompts = json.load(open(prompts_path))
llm = Llama(model_path=gguf, n_ctx=2048, n_batch=512, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False)


def report(phase, tokens, seconds):
    print(json.dumps({"engine": "llama.cpp", "weights": "as stored (Q4_1)", "phase": phase,
                      "concurrency": 1, "tokens": tokens, "seconds": seconds}), flush=True)


total, start = 0, time.perf_counter()
for ids in prompts:
    llm.reset()
    llm.eval(ids)
    total += len(ids)
report("prompt", total, time.perf_counter() - start)

# Decode: the first prompt, then new_tokens - 1 greedy steps (as bench-generate
# counts them: the first token comes with the prompt and is not timed).
llm.reset()
llm.eval(prompts[0])
token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
steps, start = 0, time.perf_counter()
for _ in range(new_tokens - 1):
    llm.eval([token])
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    steps += 1
report("decode", steps, time.perf_counter() - start)
