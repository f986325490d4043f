"""Streams N chat completions at once through a sluice gateway with the
official openai SDK and prints, per stream, when its first text and its last
chunk came (seconds from its request) and its completion tokens, as JSON.
One request runs first, unmeasured, to warm the process up.

    online_client.py BASE_URL N MAX_TOKENS PROMPTS_JSON
"""
import asyncio
import json
import sys
import time

from openai import AsyncOpenAI


async def one(client, prompt, max_tokens):
    start = time.perf_counter()
    first = None
    last = None
    tokens = None
    text = ""
    stream = await client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        now = time.perf_counter() - start
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
                if first is None:
                    first = now
                last = now
    return {"first": first, "last": last, "tokens": tokens, "text": text}


async def main():
    base, n, max_tokens, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    client = AsyncOpenAI(base_url=base, api_key="sk-bench-0123456789", max_retries=0, timeout=600)
    # Warm up this process (the SDK's first request, its first parse) and
    # open a connection, so the figures are the queue's, not Python's.
    await one(client, prompts[0], 1)
    got = await asyncio.gather(*(one(client, prompts[i % len(prompts)], max_tokens) for i in range(n)))
    print(json.dumps(got))


asyncio.run(main())
