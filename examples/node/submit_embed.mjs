#!/usr/bin/env node
// Submit an embedding job to sluice from Node.js, wait for its result, read the output.
//
// Only what the published contract says is used here (schemas/json/*.schema.json
// and schemas/README.md): no sluice library.
//
//   1. upload the texts as JSONL to S3 and presign a GET URL for them;
//   2. publish the job to JetStream on `sluice.jobs.embed`, with the job id as
//      `Nats-Msg-Id` (a re-publish within the duplicate window is dropped) and
//      our own inbox as `Sluice-Reply-To`;
//   3. wait for the result on that inbox; read the vectors from S3 (`.npy`) or
//      inline, as the result says.
//
// Environment (the same as the `sluice` CLI's): NATS_URL, SLUICE_NAMESPACE,
// SLUICE_BUCKET, AWS_ENDPOINT_URL, AWS_REGION and the standard AWS credentials.
//
// Usage: node submit_embed.mjs [TEXT ...]   (texts, or one per line on stdin)
// Prints one JSON line: {"job_id", "output", "shape", "norms"}. Exit 1 when the
// job fails (the error is printed), 2 on bad usage or no answer in time.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect, createInbox, headers } from "nats";
import { S3Client, PutObjectCommand, GetObjectCommand } from "@aws-sdk/client-s3";
import { getSignedUrl } from "@aws-sdk/s3-request-presigner";

const env = (name, fallback) => process.env[name] || fallback;

// A .npy file of little-endian float32 as [rows][dim] (the format the
// consumer writes: version 1 or 2 header, C order).
function readNpyF32(buf) {
  if (buf.subarray(0, 6).toString("latin1") !== "\x93NUMPY") throw new Error("not a .npy file");
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = buf.subarray(major === 1 ? 10 : 12, start).toString("latin1");
  if (!header.includes("'<f4'")) throw new Error(`not float32: ${header}`);
  const shape = header.match(/'shape': \((\d+), (\d+)\)/).slice(1).map(Number);
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset + start, buf.byteOffset + buf.length));
  const rows = [];
  for (let r = 0; r < shape[0]; r++) rows.push(Array.from(data.subarray(r * shape[1], (r + 1) * shape[1])));
  return rows;
}

async function main() {
  let texts = process.argv.slice(2);
  if (texts.length === 0) {
    texts = readFileSync(0, "utf8").split("\n").filter((l) => l.trim() !== "");
  }
  if (texts.length === 0) {
    console.error("submit_embed.mjs: give texts as arguments or on stdin");
    return 2;
  }
  const namespace = env("SLUICE_NAMESPACE", "");
  const prefix = namespace ? `${namespace}.` : "";
  const bucket = env("SLUICE_BUCKET", "sluice");
  const s3 = new S3Client({
    endpoint: env("AWS_ENDPOINT_URL", undefined),
    region: env("AWS_REGION", "us-east-1"),
    forcePathStyle: true,
  });

  // 1. The input: JSONL, one JSON string per line, behind a presigned URL.
  const jobId = `node-${randomUUID()}`;
  const key = `inputs/${jobId}.jsonl`;
  const body = texts.map((t) => JSON.stringify(t) + "\n").join("");
  await s3.send(new PutObjectCommand({ Bucket: bucket, Key: key, Body: body }));
  const url = await getSignedUrl(s3, new GetObjectCommand({ Bucket: bucket, Key: key }), {
    expiresIn: 3600,
  });
  const job = {
    version: 1,
    id: jobId,
    task: "embed",
    model: "all-minilm-l6-v2",
    // `object` is optional: it lets `sluice dlq replay --refresh-urls` re-sign.
    inputs: [{ type: "url", url, format: "jsonl", object: { bucket, key } }],
  };

  // 2. Publish, after subscribing to where the result will go.
  const nc = await connect({ servers: env("NATS_URL", "nats://127.0.0.1:4222") });
  let result;
  try {
    const inbox = createInbox();
    const sub = nc.subscribe(inbox, { max: 1 });
    const h = headers();
    h.set("Nats-Msg-Id", jobId);
    h.set("Sluice-Reply-To", inbox);
    const ack = await nc.jetstream().publish(`${prefix}sluice.jobs.embed`, JSON.stringify(job), {
      headers: h,
    });
    console.error(`submitted ${jobId} (stream sequence ${ack.seq})`);

    // 3. The result.
    const timeoutMs = 1000 * Number(env("SLUICE_WAIT_TIMEOUT_SECS", "120"));
    const timer = setTimeout(() => sub.unsubscribe(), timeoutMs);
    for await (const msg of sub) {
      result = JSON.parse(new TextDecoder().decode(msg.data));
    }
    clearTimeout(timer);
  } finally {
    await nc.close();
  }
  if (!result) {
    console.error(`submit_embed.mjs: no result for ${jobId} in time`);
    return 2;
  }
  if (result.status !== "ok") {
    console.error(`${jobId}: ${result.error.code}: ${result.error.message}`);
    return 1;
  }
  const output = result.output;
  let vectors;
  if (output.type === "s3") {
    const obj = await s3.send(new GetObjectCommand({ Bucket: output.bucket, Key: output.key }));
    vectors = readNpyF32(Buffer.from(await obj.Body.transformToByteArray()));
  } else {
    vectors = output.embeddings;
  }
  const norm = (v) => Math.round(1e4 * Math.sqrt(v.reduce((s, x) => s + x * x, 0))) / 1e4;
  console.log(
    JSON.stringify({
      job_id: jobId,
      output: output.type,
      shape: [vectors.length, vectors[0].length],
      norms: vectors.map(norm),
    }),
  );
  return 0;
}

process.exitCode = await main();
