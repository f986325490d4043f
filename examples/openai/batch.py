"""Runs an OpenAI batch file on sluice with the official OpenAI SDK.

Nothing here is sluice-specific but the base URL: the same code runs against
api.openai.com.

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sk-... \
        python examples/openai/batch.py requests.jsonl output.jsonl [errors.jsonl]

Uploads the file, creates the batch on the endpoint of its first line, polls
until it ends, downloads the output (and error) file and prints the final
batch object as JSON.
"""

import json
import sys
import time

from openai import OpenAI


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    requests, output_path = sys.argv[1], sys.argv[2]
    errors_path = sys.argv[3] if len(sys.argv) > 3 else None
    window = "24h"
    for arg in sys.argv[4:]:
        if arg.startswith("--window="):
            window = arg.split("=", 1)[1]

    with open(requests, encoding="utf-8") as f:
        first = json.loads(f.readline())

    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    batch_file = client.files.create(file=open(requests, "rb"), purpose="batch")
    batch = client.batches.create(
        input_file_id=batch_file.id,
        endpoint=first["url"],
        completion_window=window,
        metadata={"source": "examples/openai/batch.py"},
    )
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)

    if batch.output_file_id:
        client.files.content(batch.output_file_id).write_to_file(output_path)
    if batch.error_file_id and errors_path:
        client.files.content(batch.error_file_id).write_to_file(errors_path)
    print(batch.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
