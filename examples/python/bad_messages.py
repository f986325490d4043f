#!/usr/bin/env python3
"""Publish messages sluice cannot run, from Python, and show each one answered.

Written only from the published contract (schemas/README.md and
schemas/json/*.schema.json), like submit_embed.py. Every message below names
its own inbox as `Sluice-Reply-To`; the contract says each one gets exactly
one result there, readable or not, under the body's `id` when it can be read,
else under the `Nats-Msg-Id` header, else with `"job_id": null`.

Environment: NATS_URL, SLUICE_NAMESPACE (as the `sluice` CLI's).

Usage: bad_messages.py [OVERSIZE_BYTES]   (size of the oversized inline job;
default 200000: run the consumer with --max-input-bytes below it)
Prints one JSON line: {"answers": [{"kind", "sent_id", "job_id", "status",
"code", "message", "header_job_id", "header_outcome"}, ...]}; a message not
answered in time has "status": null. Exit 0 when every message was answered,
1 otherwise.
"""

import asyncio
import json
import os
import sys
import uuid

import nats


def env(name, default=None):
    value = os.environ.get(name)
    return value if value else default


def job(job_id, items, **extra):
    return {
        "version": 1,
        "id": job_id,
        "task": "embed",
        "model": "all-minilm-l6-v2",
        "inputs": [{"type": "inline", "items": items}],
        **extra,
    }


async def main() -> int:
    oversize = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    namespace = env("SLUICE_NAMESPACE", "")
    subject = f"{namespace}.sluice.jobs.embed" if namespace else "sluice.jobs.embed"
    run = uuid.uuid4().hex[:8]

    # (kind, Nats-Msg-Id or None, body)
    messages = [
        ("not_json", f"py-{run}-not-json", b"this is not json"),
        ("not_utf8", f"py-{run}-not-utf8", b"\xff\xfe\xfd{"),
        ("json_array", f"py-{run}-array", b"[1, 2, 3]"),
        ("id_refused_by_schema", f"py-{run}-bad-id",
         json.dumps(job("has space/and slash", ["hi"])).encode()),
        ("inline_over_size_cap", f"py-{run}-big",
         json.dumps(job(f"py-{run}-big", ["x" * oversize])).encode()),
        ("no_id_anywhere", None, b"still not json"),
        ("inline_item_not_text", f"py-{run}-item-42",
         json.dumps(job(f"py-{run}-item-42", [42])).encode()),
        ("presign_out_of_range", f"py-{run}-presign-0",
         json.dumps(job(f"py-{run}-presign-0", ["hi"], output={"presign_get_secs": 0})).encode()),
        # Not bad: a valid job without Nats-Msg-Id runs (without the server's
        # de-duplication of a re-publish).
        ("valid_without_msg_id", None,
         json.dumps(job(f"py-{run}-no-msg-id", ["a fine text"])).encode()),
    ]

    nc = await nats.connect(env("NATS_URL", "nats://127.0.0.1:4222"))
    answers = []
    try:
        js = nc.jetstream()
        subs = []
        for kind, msg_id, body in messages:
            inbox = nc.new_inbox()
            subs.append(await nc.subscribe(inbox))
            headers = {"Sluice-Reply-To": inbox}
            if msg_id is not None:
                headers["Nats-Msg-Id"] = msg_id
            await js.publish(subject, body, headers=headers)
        timeout = float(env("SLUICE_WAIT_TIMEOUT_SECS", "60"))

        async def answer(sub):
            try:
                return await sub.next_msg(timeout=timeout)
            except nats.errors.TimeoutError:
                return None

        replies = await asyncio.gather(*(answer(s) for s in subs))
    finally:
        await nc.close()

    for (kind, msg_id, _), reply in zip(messages, replies):
        entry = {"kind": kind, "sent_id": msg_id, "job_id": None, "status": None,
                 "code": None, "message": None, "header_job_id": None,
                 "header_outcome": None}
        if reply is not None:
            result = json.loads(reply.data)
            headers = reply.headers or {}
            entry.update(
                job_id=result["job_id"],
                status=result["status"],
                code=result.get("error", {}).get("code"),
                message=result.get("error", {}).get("message"),
                header_job_id=headers.get("Sluice-Job-Id"),
                header_outcome=headers.get("Sluice-Outcome"),
            )
        answers.append(entry)
    print(json.dumps({"answers": answers}))
    return 0 if all(a["status"] is not None for a in answers) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
