#!/usr/bin/env python3
"""Writes the fixed mixed-length benchmark corpus: N texts, JSONL, seeded.

Lengths follow a wide mix (a few words to past the 256-token limit) so that
padding and length grouping matter. With `pairs`, writes N rerank items
instead: {"query": the first 4 to 12 words of one text, "document": another
text}, the documents the same mix.

Usage: corpus.py OUT.jsonl [N] [pairs]
"""
import json
import random
import sys

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "can more will no out so said what up its about than into them only other time new some "
    "could these two may first then do any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see "
    "memory budget batch token stream consumer model vector queue latency throughput device "
    "cache durable replay signal object storage inference embedding transformer attention "
    "kubernetes cluster replica deadline retry backoff ledger invoice weather river mountain"
).split()


def main() -> None:
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    texts = list(corpus(n))
    pairs = sys.argv[3:4] == ["pairs"]
    rng = random.Random(20261205)
    with open(out, "w") as f:
        for i, text in enumerate(texts):
            if pairs:
                words = texts[(i * 7 + 3) % n].rstrip(".").split()
                query = " ".join(words[: rng.randint(4, 12)])
                f.write(json.dumps({"query": query, "document": text}) + "\n")
            else:
                f.write(json.dumps(text) + "\n")


def corpus(n: int):
    """The n texts, the same on every run."""
    rng = random.Random(20261129)
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            words = rng.randint(3, 20)
        elif r < 0.70:
            words = rng.randint(20, 90)
        elif r < 0.92:
            words = rng.randint(90, 200)
        else:
            words = rng.randint(200, 320)
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        yield text[0].upper() + text[1:] + "."


if __name__ == "__main__":
    main()
