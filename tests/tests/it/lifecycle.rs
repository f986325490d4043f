//! Files that expire (issue #40), with the official `openai` SDK: an upload
//! with `expires_after` of a few seconds answers 404 after and its S3
//! object is removed, while another, the input of a batch that is still
//! running, keeps its bytes until the batch has ended (and the batch's
//! answers prove they were read); deleting a running batch's input is
//! refused 409; a batch's `output_expires_after` removes its output file;
//! an ended batch's chunk inputs and chunk outputs are removed at its end;
//! a file that says nothing expires after `--retention-days`.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::deploy::Deployment;

const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

/// Phase 1 (no consumer yet, so batches stay in progress): uploads and two
/// batches.
const UPLOAD: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI()
lines = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
    "body": {"model": "all-minilm-l6-v2", "input": f"text {i}"}}) + "\n" for i in range(3)).encode()
soon = {"anchor": "created_at", "seconds": 3}
a = client.files.create(file=("a.jsonl", lines), purpose="batch", expires_after=soon)
b = client.files.create(file=("b.jsonl", lines), purpose="batch", expires_after=soon)
c = client.files.create(file=("c.jsonl", lines), purpose="batch")
on_b = client.batches.create(input_file_id=b.id, endpoint="/v1/embeddings", completion_window="24h")
# Long enough for phase 3 to read the output before it expires, on a
# loaded machine too (it expired under the script once at 3 s).
on_c = client.batches.create(input_file_id=c.id, endpoint="/v1/embeddings", completion_window="24h",
                             output_expires_after={"anchor": "created_at", "seconds": 20})
out = {"a": a.model_dump(), "b": b.model_dump(), "c": c.model_dump(), "on_b": on_b.id, "on_c": on_c.id}
try:
    client.files.create(file=("d.jsonl", lines), purpose="batch", expires_after={"anchor": "created_at", "seconds": 0})
except Exception as e:
    out["refused"] = {"status": e.status_code, "body": e.body}
print(json.dumps(out))
"#;

/// Phase 2 (past the expiry): what the expired files answer; deleting a
/// running batch's input.
const EXPIRED: &str = r#"
import json, sys
import openai
from openai import OpenAI
client = OpenAI()
ids = json.loads(sys.argv[1])
out = {}
for name in ("a", "b"):
    try:
        client.files.retrieve(ids[name])
        out[name] = "found"
    except openai.NotFoundError as e:
        out[name] = 404
out["listed"] = [f.id for f in client.files.list()]
try:
    client.files.delete(ids["c"])
    out["delete_c"] = "deleted"
except openai.APIStatusError as e:
    out["delete_c"] = {"status": e.status_code, "body": e.body}
print(json.dumps(out))
"#;

/// Phase 3 (a consumer runs): both batches end; their outputs.
const ENDED: &str = r#"
import json, sys, time
from openai import OpenAI
client = OpenAI()
ids = json.loads(sys.argv[1])
out = {}
# on_c first: its output expires 20 s after it is written.
for name in ("on_c", "on_b"):
    b = client.batches.retrieve(ids[name])
    deadline = time.time() + 120
    while b.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
        time.sleep(0.3)
        b = client.batches.retrieve(b.id)
    f = client.files.retrieve(b.output_file_id) if b.output_file_id else None
    lines = client.files.content(b.output_file_id).text.splitlines() if b.output_file_id else []
    out[name] = {"status": b.status, "output": b.output_file_id, "counts": b.request_counts.model_dump(),
                 "lines": [json.loads(l)["custom_id"] for l in lines],
                 "created_at": f.created_at if f else None, "expires_at": f.expires_at if f else None}
print(json.dumps(out))
"#;

/// Phase 4: the expired output file.
const OUTPUT_GONE: &str = r#"
import json, sys
import openai
from openai import OpenAI
client = OpenAI()
try:
    client.files.retrieve(sys.argv[1])
    print(json.dumps("found"))
except openai.NotFoundError:
    print(json.dumps(404))
"#;

#[tokio::test]
async fn expired_files_answer_404_and_go_while_a_running_batchs_input_stays() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--sweep-interval-secs=1", "--expiry-grace-secs=2"])
        .await
        .unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let python = |script: &'static str, args: Vec<String>| {
        let base = base.clone();
        async move {
            sluice_tests::sdk::run_python(script, &args, &base, KEY, Duration::from_secs(200)).await
        }
    };
    let object = |id: &Value| format!("gateway/files/{}", id.as_str().unwrap());
    let exists = |key: String| {
        let d = &d;
        async move { d.read_object(&key).await.is_ok() }
    };

    let up = python(UPLOAD, vec![]).await;
    eprintln!("{up:#}");
    for name in ["a", "b"] {
        assert_eq!(
            up[name]["expires_at"].as_i64().unwrap(),
            up[name]["created_at"].as_i64().unwrap() + 3,
            "{name}: {up}"
        );
    }
    // Said nothing: the default retention, 30 days (OpenAI's for batch files).
    assert_eq!(
        up["c"]["expires_at"].as_i64().unwrap(),
        up["c"]["created_at"].as_i64().unwrap() + 30 * 86_400
    );
    assert_eq!(up["refused"]["status"], 400, "{up}");
    assert_eq!(up["refused"]["body"]["param"], "expires_after");
    let ids = json!({"a": up["a"]["id"], "b": up["b"]["id"], "c": up["c"]["id"],
        "on_b": up["on_b"], "on_c": up["on_c"]})
    .to_string();

    // Past expiry (3 s), grace (2 s) and a sweep (1 s): both answer 404;
    // a's bytes are gone, b's (a running batch's input) are not.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while exists(object(&up["a"]["id"])).await {
        assert!(
            tokio::time::Instant::now() < until,
            "the expired file's object is still there after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // more sweeps
    assert!(
        exists(object(&up["b"]["id"])).await,
        "a running batch's input was removed"
    );
    let expired = python(EXPIRED, vec![ids.clone()]).await;
    eprintln!("{expired:#}");
    assert_eq!(expired["a"], 404);
    assert_eq!(expired["b"], 404, "an expired input answers 404 too");
    let listed = expired["listed"].as_array().unwrap();
    assert!(!listed.contains(&up["a"]["id"]) && !listed.contains(&up["b"]["id"]));
    assert!(listed.contains(&up["c"]["id"]));
    assert_eq!(expired["delete_c"]["status"], 409, "{expired}");
    assert_eq!(expired["delete_c"]["body"]["code"], "file_in_use");
    assert!(exists(object(&up["c"]["id"])).await);

    // A consumer: both batches end, b's answered from its kept input.
    let consumer = d.start_consumer(&[]).await.unwrap();
    let ended = python(ENDED, vec![ids]).await;
    eprintln!("{ended:#}");
    for name in ["on_b", "on_c"] {
        assert_eq!(ended[name]["status"], "completed", "{ended}");
        assert_eq!(ended[name]["lines"], json!(["c0", "c1", "c2"]), "{ended}");
    }
    assert_eq!(
        ended["on_c"]["expires_at"].as_i64().unwrap(),
        ended["on_c"]["created_at"].as_i64().unwrap() + 20
    );
    assert_eq!(
        ended["on_b"]["expires_at"].as_i64().unwrap(),
        ended["on_b"]["created_at"].as_i64().unwrap() + 30 * 86_400
    );
    // Ended: b's input goes at the next sweeps, and so does on_c's output
    // once it expired; the chunks' inputs and outputs went at the end.
    let output_c = object(&ended["on_c"]["output"]);
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while exists(object(&up["b"]["id"])).await || exists(output_c.clone()).await {
        assert!(
            tokio::time::Instant::now() < until,
            "an ended batch's expired input or expired output is still there after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone = python(
        OUTPUT_GONE,
        vec![ended["on_c"]["output"].as_str().unwrap().into()],
    )
    .await;
    assert_eq!(gone, 404);
    for batch in [&up["on_b"], &up["on_c"]] {
        let batch = batch.as_str().unwrap();
        assert_eq!(
            d.keys_under(&format!("gateway/chunks/{batch}"))
                .await
                .unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            d.keys_under(&format!("outputs/{batch}")).await.unwrap(),
            Vec::<String>::new()
        );
    }
    // What did not expire stays: c and on_b's output.
    assert!(exists(object(&up["c"]["id"])).await);
    assert!(exists(object(&ended["on_b"]["output"])).await);
    gateway.stop();
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// A batch's chunks' status records must outlive its window by a day (it
/// finalizes from them): a window the status bucket cannot hold is refused
/// 400, naming the setting, and a shorter one is taken.
#[tokio::test]
async fn a_window_longer_than_the_status_records_live_is_refused_naming_the_setting() {
    let settings = sluice_producer::provision::Settings {
        status_max_age: Duration::from_secs(36 * 3600),
        ..Default::default()
    };
    let d = Deployment::start_with(settings).await.unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let api = sluice_tests::api::Api::new(gateway.addr);
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
        "body": {"model": "all-minilm-l6-v2", "input": "x"}});
    let (_, file) = api.upload(KEY, format!("{line}\n").as_bytes()).await;
    let create = |window: &'static str| {
        let api = &api;
        let file = &file;
        async move {
            api.post(
                "/batches",
                KEY,
                json!({"input_file_id": file["id"], "endpoint": "/v1/embeddings", "completion_window": window}),
            )
            .await
        }
    };
    let (status, body) = create("24h").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "completion_window");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("status_max_age_secs") && message.contains("at most 43200 s"),
        "{message}"
    );
    let (status, body) = create("12h").await;
    assert_eq!(status, 200, "{body}");
    gateway.stop();
}

/// Every list call read every tenant's records (the whole bucket, one read
/// each). Now each tenant's files and batches are indexed under
/// `tenant.<tenant>.<kind>.<id>` and its lists read that index alone; a
/// record from before the index joins it at the next sweep, and an entry
/// whose record is gone is skipped.
#[tokio::test]
async fn a_tenants_lists_read_its_own_index_and_older_records_join_it_at_a_sweep() {
    const KEY_B: &str = "sk-team-b-0123456789";
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(
            &format!("{KEYS},team-b:{KEY_B}"),
            &["--sweep-interval-secs=1"],
        )
        .await
        .unwrap();
    let api = sluice_tests::api::Api::new(gateway.addr);
    let line = b"{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"model\": \"m\", \"input\": \"x\"}}\n";
    let (_, a) = api.upload(KEY, line).await;
    let (_, b) = api.upload(KEY_B, line).await;
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());

    let js = async_nats::jetstream::new(d.servers.nats.connect().await.unwrap());
    let kv = js.get_key_value(&d.topology.gateway_bucket).await.unwrap();
    let index = || async {
        let keys: Vec<String> = futures::TryStreamExt::try_collect(kv.keys().await.unwrap())
            .await
            .unwrap();
        let mut index: Vec<String> = keys
            .into_iter()
            .filter(|k| k.starts_with("tenant."))
            .collect();
        index.sort();
        index
    };
    let mut expected = vec![
        format!("tenant.team-a.file.{a}"),
        format!("tenant.team-b.file.{b}"),
    ];
    expected.sort();
    assert_eq!(index().await, expected);

    // Team A's record from before the index (no entry), and an entry of
    // team A's whose record is gone.
    let mut older: Value =
        serde_json::from_slice(&kv.get(format!("file.{a}")).await.unwrap().unwrap()).unwrap();
    let older_id = "file-00000000000000000000000000000001";
    older["id"] = json!(older_id);
    kv.put(
        format!("file.{older_id}"),
        serde_json::to_vec(&older).unwrap().into(),
    )
    .await
    .unwrap();
    kv.put("tenant.team-a.file.file-gone", "{}".into())
        .await
        .unwrap();

    let listed = |key: &'static str| {
        let api = &api;
        async move {
            let (status, list) = api.get("/files", key).await;
            assert_eq!(status, 200, "{list}");
            let mut ids: Vec<String> = list["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ids = listed(KEY).await;
        if ids.len() == 2 {
            let mut want = vec![a.to_string(), older_id.to_string()];
            want.sort();
            assert_eq!(ids, want);
            break;
        }
        assert_eq!(ids, vec![a.to_string()], "team A's list");
        assert!(
            tokio::time::Instant::now() < until,
            "the older record never joined team A's list"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(listed(KEY_B).await, vec![b.to_string()], "team B's list");
    assert!(
        index()
            .await
            .contains(&format!("tenant.team-a.file.{older_id}"))
    );
}
