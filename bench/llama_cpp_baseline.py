"""llama.cpp (llama-cpp-python) on the same GGUF and the same prompt token ids
as bench-generate: prompt tokens/s (each prompt read once, one at a time),
greedy decode tokens/s for one sequence, and, for each CONCURRENCY above one,
llama.cpp's own batched decode: that many sequences (prompts cycled as
bench-generate cycles them) stepped together, one token each per
`llama_batch`, through the low-level API. Prints one JSON object per figure.

    python bench/llama_cpp_baseline.py GGUF PROMPTS.json NEW_TOKENS THREADS [CONCURRENCY...]
"""
import ctypes
import json
import sys
import time

import numpy as np
from llama_cpp import Llama

import llama_cpp

gguf, prompts_path, new_tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
levels = [int(n) for n in sys.argv[5:]]
prompts = json.load(open(prompts_path))
llm = Llama(model_path=gguf, n_ctx=2048, n_batch=512, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False)


def report(phase, tokens, seconds, concurrency=1):
    print(json.dumps({"engine": "llama.cpp", "weights": "as stored", "phase": phase,
                      "concurrency": concurrency, "tokens": tokens, "seconds": seconds}),
          flush=True)


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


def batched_decode(n):
    """n sequences decoded together: their prompts in one batch (not timed),
    then new_tokens - 1 steps of one batch holding each sequence's next
    token, greedy."""
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = 256 * n
    cparams.n_batch = cparams.n_ubatch = 4096
    cparams.n_seq_max = n
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(llm.model, cparams)
    if not ctx:
        sys.exit(f"llama.cpp: no context for {n} sequences")
    seqs = [prompts[i % len(prompts)] for i in range(n)]
    batch = llama_cpp.llama_batch_init(sum(len(p) for p in seqs), 0, n)

    def run(entries):
        """entries: (token, position, sequence, wants logits); returns the
        greedy token of each entry that wanted logits, in order."""
        batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i] = token, pos
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq
            batch.logits[i] = logits
        if llama_cpp.llama_decode(ctx, batch) != 0:
            sys.exit(f"llama.cpp: llama_decode failed for {n} sequences")
        out = []
        for i, entry in enumerate(entries):
            if entry[3]:
                row = llama_cpp.llama_get_logits_ith(ctx, i)
                out.append(int(np.argmax(np.ctypeslib.as_array(row, shape=(n_vocab,)))))
        return out

    prefill = [(t, pos, s, pos == len(p) - 1)
               for s, p in enumerate(seqs) for pos, t in enumerate(p)]
    tokens = run(prefill)
    positions = [len(p) for p in seqs]
    steps, start = 0, time.perf_counter()
    for _ in range(new_tokens - 1):
        tokens = run([(t, positions[s], s, True) for s, t in enumerate(tokens)])
        positions = [p + 1 for p in positions]
        steps += n
    report("decode", steps, time.perf_counter() - start, n)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)


n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
for n in levels:
    if n > 1:
        batched_decode(n)
