#!/usr/bin/env python3
"""Submit an embedding job to sluice from Python, wait for its result, read the output.

Only what the published contract says is used here (schemas/json/*.schema.json
and schemas/README.md): no sluice library.

  1. upload the texts as JSONL to S3 and presign a GET URL for them;
  2. publish the job to JetStream on `sluice.jobs.embed`, with the job id as
     `Nats-Msg-Id` (a re-publish within the duplicate window is dropped) and
     our own inbox as `Sluice-Reply-To`;
  3. wait for the result on that inbox; read the vectors from S3 (`.npy`) or
     inline, as the result says.

Environment (the same as the `sluice` CLI's): NATS_URL, SLUICE_NAMESPACE,
SLUICE_BUCKET, AWS_ENDPOINT_URL, AWS_REGION and the standard AWS credentials.

Usage: submit_embed.py [TEXT ...]   (texts, or one per line on stdin)
Prints one JSON line: {"job_id", "output", "shape", "norms"}. Exit 1 when the
job fails (the error is printed), 2 on bad usage or no answer in time.
"""

import asyncio
import io
import json
import os
import sys
import uuid

import boto3
import nats
import numpy as np
from botocore.config import Config


def env(name, default=None):
    value = os.environ.get(name)
    return value if value else default


async def main() -> int:
    texts = sys.argv[1:] or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        print("submit_embed.py: give texts as arguments or on stdin", file=sys.stderr)
        return 2
    namespace = env("SLUICE_NAMESPACE", "")
    prefix = f"{namespace}." if namespace else ""
    bucket = env("SLUICE_BUCKET", "sluice")
    s3 = boto3.client(
        "s3",
        endpoint_url=env("AWS_ENDPOINT_URL"),
        region_name=env("AWS_REGION", "us-east-1"),
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )

    # 1. The input: JSONL, one JSON string per line, behind a presigned URL.
    job_id = f"py-{uuid.uuid4()}"
    key = f"inputs/{job_id}.jsonl"
    body = "".join(json.dumps(t) + "\n" for t in texts).encode()
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600
    )
    job = {
        "version": 1,
        "id": job_id,
        "task": "embed",
        "model": "all-minilm-l6-v2",
        # `object` is optional: it lets `sluice dlq replay --refresh-urls` re-sign.
        "inputs": [
            {"type": "url", "url": url, "format": "jsonl",
             "object": {"bucket": bucket, "key": key}}
        ],
    }

    # 2. Publish, after subscribing to where the result will go.
    nc = await nats.connect(env("NATS_URL", "nats://127.0.0.1:4222"))
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        js = nc.jetstream()
        ack = await js.publish(
            f"{prefix}sluice.jobs.embed",
            json.dumps(job).encode(),
            headers={"Nats-Msg-Id": job_id, "Sluice-Reply-To": inbox},
        )
        print(f"submitted {job_id} (stream sequence {ack.seq})", file=sys.stderr)

        # 3. The result.
        try:
            msg = await sub.next_msg(timeout=float(env("SLUICE_WAIT_TIMEOUT_SECS", "120")))
        except nats.errors.TimeoutError:
            print(f"submit_embed.py: no result for {job_id} in time", file=sys.stderr)
            return 2
    finally:
        await nc.close()

    result = json.loads(msg.data)
    if result["status"] != "ok":
        error = result["error"]
        print(f"{job_id}: {error['code']}: {error['message']}", file=sys.stderr)
        return 1
    output = result["output"]
    if output["type"] == "s3":
        obj = s3.get_object(Bucket=output["bucket"], Key=output["key"])
        vectors = np.load(io.BytesIO(obj["Body"].read()))
    else:
        vectors = np.asarray(output["embeddings"], dtype=np.float32)
    print(json.dumps({
        "job_id": job_id,
        "output": output["type"],
        "shape": list(vectors.shape),
        "norms": [round(float(n), 4) for n in np.linalg.norm(vectors, axis=1)],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
