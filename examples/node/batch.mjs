// Runs an OpenAI batch file on sluice with the official OpenAI SDK for Node.
// Nothing here is sluice-specific but the base URL.
//
//   OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sk-... \
//     node examples/node/batch.mjs requests.jsonl output.jsonl [errors.jsonl]
//
// Uploads the file, creates the batch on the endpoint of its first line, polls
// until it ends, writes the output (and error) file and prints the final batch
// object as JSON.
import fs from "node:fs";
import OpenAI from "openai";

const [requests, outputPath, errorsPath] = process.argv.slice(2);
if (!requests || !outputPath) {
  console.error("usage: node batch.mjs requests.jsonl output.jsonl [errors.jsonl]");
  process.exit(2);
}
const first = JSON.parse(fs.readFileSync(requests, "utf8").split("\n")[0]);

const client = new OpenAI(); // OPENAI_BASE_URL and OPENAI_API_KEY from the environment
const file = await client.files.create({ file: fs.createReadStream(requests), purpose: "batch" });
let batch = await client.batches.create({
  input_file_id: file.id,
  endpoint: first.url,
  completion_window: "24h",
});
while (!["completed", "failed", "expired", "cancelled"].includes(batch.status)) {
  await new Promise((r) => setTimeout(r, 500));
  batch = await client.batches.retrieve(batch.id);
}
if (batch.output_file_id) {
  const content = await client.files.content(batch.output_file_id);
  fs.writeFileSync(outputPath, Buffer.from(await content.arrayBuffer()));
}
if (batch.error_file_id && errorsPath) {
  const content = await client.files.content(batch.error_file_id);
  fs.writeFileSync(errorsPath, Buffer.from(await content.arrayBuffer()));
}
console.log(JSON.stringify(batch));
