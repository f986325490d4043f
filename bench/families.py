#!/usr/bin/env python3
"""Makes the encoder families bench/embed measures beside all-MiniLM-L6-v2,
each at the shape of a model teams deploy, with seeded random weights (made
offline from a config with transformers; no download: speed does not depend
on the weights' values, and the bench still checks that sluice and PyTorch
agree on them):

  bert-base         BERT at bge-base-en-v1.5's shape: 768 wide, 12 layers, 12
                    heads, intermediate 3072, 512 positions, CLS pooling then
                    Normalize; all-MiniLM-L6-v2's uncased WordPiece vocabulary
                    (30,522, the same as bge's).
  xlm-roberta-base  XLM-RoBERTa at multilingual-e5-base's shape: 768 x 12
                    layers, 12 heads, 3072, 514 positions after the padding id,
                    one token type, mean pooling then Normalize; a Unigram
                    vocabulary trained on the bench corpus (the real one's
                    250,002 entries would only grow the embedding table).
  reranker          a cross-encoder at ms-marco-MiniLM-L6-v2's shape (BERT 384
                    wide, 6 layers, 12 heads, 1536, one label, sigmoid),
                    all-MiniLM-L6-v2's vocabulary with BERT's pair template.

Writes the sentence-transformers directory (SentenceTransformer.save or
CrossEncoder.save) to OUT. Run with bench/embed's venv:

    bench/.venv/bin/python bench/families.py FAMILY OUT CORPUS.jsonl
"""

import json
import os
import shutil
import sys

import torch
from sentence_transformers import CrossEncoder, SentenceTransformer, models
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import Unigram
from transformers import (
    BertConfig, BertForSequenceClassification, BertModel, PreTrainedTokenizerFast,
    XLMRobertaConfig, XLMRobertaModel,
)

MINILM_TOKENIZER = "weights/all-minilm-l6-v2/tokenizer.json"


def wordpiece(pairs: bool) -> PreTrainedTokenizerFast:
    """all-MiniLM-L6-v2's tokenizer, without its fixed padding and
    truncation, with BERT's pair template."""
    tok = Tokenizer.from_file(MINILM_TOKENIZER)
    tok.no_padding()
    tok.no_truncation()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    names = ["input_ids", "token_type_ids", "attention_mask"] if pairs else None
    kwargs = {"model_input_names": names} if names else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", **kwargs,
    )


def unigram(texts: list) -> PreTrainedTokenizerFast:
    tok = Tokenizer(Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=4000, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        unk_token="<unk>",
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<mask>",
    )


def randomize(model: torch.nn.Module, hidden: int) -> None:
    """Seeded weights with std 0.3 x sqrt(64 / width), as the test fixtures
    draw them: attention that is not saturated, vectors that differ."""
    std = 0.3 * (64 / hidden) ** 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.eval()


def sentence_encoder(out, tokenizer, model, hidden, mode, max_seq_length):
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    transformer = models.Transformer(out, max_seq_length=max_seq_length)
    st = SentenceTransformer(
        modules=[transformer, models.Pooling(hidden, pooling_mode=mode), models.Normalize()],
        device="cpu",
    )
    st.save(out)


def main() -> None:
    family, out, corpus = sys.argv[1:4]
    texts = [json.loads(line) for line in open(corpus) if line.strip()]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    torch.manual_seed(0)
    if family == "bert-base":
        tokenizer = wordpiece(pairs=False)
        config = BertConfig(
            vocab_size=tokenizer.backend_tokenizer.get_vocab_size(), hidden_size=768,
            num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            max_position_embeddings=512, layer_norm_eps=1e-12, pad_token_id=0,
        )
        model = BertModel(config, add_pooling_layer=False)
        randomize(model, 768)
        sentence_encoder(out, tokenizer, model, 768, "cls", 512)
    elif family == "xlm-roberta-base":
        tokenizer = unigram(texts)
        config = XLMRobertaConfig(
            vocab_size=len(tokenizer), hidden_size=768, num_hidden_layers=12,
            num_attention_heads=12, intermediate_size=3072, max_position_embeddings=514,
            type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
            eos_token_id=2,
        )
        model = XLMRobertaModel(config, add_pooling_layer=False)
        randomize(model, 768)
        sentence_encoder(out, tokenizer, model, 768, "mean", 512)
    elif family == "reranker":
        tokenizer = wordpiece(pairs=True)
        config = BertConfig(
            vocab_size=tokenizer.backend_tokenizer.get_vocab_size(), hidden_size=384,
            num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
            max_position_embeddings=512, layer_norm_eps=1e-12, pad_token_id=0, num_labels=1,
        )
        model = BertForSequenceClassification(config)
        randomize(model, 384)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        CrossEncoder(out, device="cpu", max_length=512).save(out)
    else:
        sys.exit(f"unknown family {family!r} (bert-base, xlm-roberta-base, reranker)")
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    print(f"bench: made {family} in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
