#!/usr/bin/env python3
"""Writes a Llama 3.2 1B-shaped GGUF with random weights in Q4_K_M's types,
for bench/generate's llama-3 row: 16 blocks, 2048 wide, 32 query heads of 64
over 8 KV heads, an MLP of 8192, Llama 3's RoPE base 500000 and frequency
factors, tied embeddings (Q6_K), attn_v and ffn_down in Q6_K, the rest
Q4_K; Llama 3's real tokenizer (vocabulary, merges, llama-bpe pre-tokenizer)
copied from llama.cpp's ggml-vocab-llama-bpe.gguf, which scripts/setup
unpacks. Speed does not depend on the weights' values: each matrix is 64
rows of seeded normals quantized (tests/fixtures/make/random_ggufs.py's K-quant
quantizer) and repeated.

    bench/.venv/bin/python bench/llama3_gguf.py OUT.gguf
"""
import importlib.util
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2048, 8192, 16, 32, 8, 64


def quantizer():
    path = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/make/random_ggufs.py")
    spec = importlib.util.spec_from_file_location("random_ggufs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.quantize_k


def main() -> None:
    out = sys.argv[1]
    quantize_k = quantizer()
    vocab = gguf.GGUFReader("weights/llama.cpp/vocab/ggml-vocab-llama-bpe.gguf")
    field = lambda k: vocab.fields[k]
    tokens = [field("tokenizer.ggml.tokens").contents(i) for i in range(len(field("tokenizer.ggml.tokens").data))]
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("sluice bench random Llama-3.2-1B-shaped Q4_K_M")
    w.add_block_count(LAYERS)
    w.add_context_length(131072)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(list(field("tokenizer.ggml.token_type").contents()))
    w.add_token_merges(list(field("tokenizer.ggml.merges").contents()))
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128009)
    w.add_chat_template(open("weights/llama.cpp/templates/meta-llama-Llama-3.2-3B-Instruct.jinja").read())

    def matrix(name, rows, cols, qtype):
        sample = rng.normal(0.0, 1.0 / np.sqrt(cols), (64, cols)).astype(np.float32)
        q = quantize_k(sample, qtype)
        w.add_tensor(name, np.tile(q, (rows // 64, 1)), raw_dtype=qtype)

    def vector(name, n):
        w.add_tensor(name, (1.0 + rng.normal(0.0, 0.1, (n,))).astype(np.float32))

    matrix("token_embd.weight", len(tokens), HIDDEN, T.Q6_K)
    vector("output_norm.weight", HIDDEN)
    w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, HEAD_DIM // 2).astype(np.float32))
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        vector(f"blk.{i}.attn_norm.weight", HIDDEN)
        vector(f"blk.{i}.ffn_norm.weight", HIDDEN)
        matrix(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN, T.Q4_K)
        matrix(f"blk.{i}.attn_k.weight", kv, HIDDEN, T.Q4_K)
        matrix(f"blk.{i}.attn_v.weight", kv, HIDDEN, T.Q6_K)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN, T.Q4_K)
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN, T.Q4_K)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN, T.Q4_K)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN, T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"bench: wrote {out} ({os.path.getsize(out) >> 20} MiB)", file=sys.stderr)


if __name__ == "__main__":
    main()
