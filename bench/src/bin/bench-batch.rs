//! An OpenAI batch of embedding lines through `sluice-gateway` (upload,
//! run on a consumer, download the output) against the model alone on the
//! same texts (`sluice-consumer embed`'s path), interleaved; then the
//! gateway's memory while a large file streams in and out. `bench/batch`
//! runs it. Prints two tables.
//!
//! Usage: bench-batch CORPUS.jsonl [LINES] [ROUNDS] [BIG_FILE_MB]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use sluice_consumer::offline::{EmbedArgs, embed_file};
use sluice_tests::deploy::Deployment;
use sluice_tests::{models_dir, resident_bytes_of};

const KEY: &str = "sk-bench-0123456789";
const KEYS: &str = "bench:sk-bench-0123456789";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let corpus = args
        .get(1)
        .context("usage: bench-batch CORPUS.jsonl [LINES] [ROUNDS] [BIG_FILE_MB]")?;
    let n: usize = args.get(2).map_or(Ok(20_000), |s| s.parse())?;
    let rounds: usize = args.get(3).map_or(Ok(2), |s| s.parse())?;
    let big_mb: u64 = args.get(4).map_or(Ok(200), |s| s.parse())?;
    let max_batch_tokens = 8192;

    let texts = sluice_tests::corpus_lines(corpus, n)?;
    let dir = tempfile::tempdir()?;
    let subset = dir.path().join("texts.jsonl");
    std::fs::write(&subset, texts.join("\n") + "\n")?;
    let mut requests = Vec::new();
    for (i, line) in texts.iter().enumerate() {
        let text: Value = serde_json::from_str(line)?;
        let text = text.get("text").cloned().unwrap_or(text);
        let request = json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "all-minilm-l6-v2", "input": text}});
        requests.extend(serde_json::to_vec(&request)?);
        requests.push(b'\n');
    }
    let requests_path = dir.path().join("requests.jsonl");
    std::fs::write(&requests_path, &requests)?;
    let model_args = EmbedArgs {
        input: subset.clone(),
        output: dir.path().join("alone.npy"),
        prompt_name: None,
        model: sluice_consumer::ModelConfig {
            model_dir: Some(models_dir().join("all-minilm-l6-v2")),
            model_name: Some("all-minilm-l6-v2".into()),
            device: sluice_consumer::config::DeviceKind::Cpu,
            cuda_ordinal: 0,
            max_tokens_per_item: None,
            max_batch_tokens,
            embed_weights: Default::default(),
            normalize: sluice_consumer::config::NormalizeRule::Always,
        },
    };

    let (mut through, mut alone, mut steps) = (Vec::new(), Vec::new(), Vec::new());
    let mut tokens = 0u64;
    for round in 1..=rounds {
        let d = Deployment::start().await?;
        let consumer = d
            .start_consumer(&[
                &format!("--max-batch-tokens={max_batch_tokens}"),
                "--memory-budget=4000000000",
            ])
            .await?;
        let gateway = d.start_gateway(KEYS, &[]).await?;
        let base = format!("http://{}/v1", gateway.addr);
        let start = Instant::now();
        let (output, used, phases) = run_batch(&base, &requests_path, dir.path()).await?;
        let secs = start.elapsed().as_secs_f64();
        ensure!(output == n, "{output} of {n} lines answered");
        tokens = used;
        gateway.stop();
        consumer.shutdown(Duration::from_secs(10)).await?;
        drop(d);
        through.push(secs);
        steps.push(phases);
        eprintln!("round {round}: through the gateway {secs:.2} s");

        let args = model_args.clone();
        let start = Instant::now();
        tokio::task::spawn_blocking(move || embed_file(&args)).await??;
        let secs = start.elapsed().as_secs_f64();
        alone.push(secs);
        eprintln!("round {round}: sluice-consumer embed {secs:.2} s");
    }
    let through_by_round = through.clone();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (g, a) = (median(&mut through), median(&mut alone));
    println!("{n} embedding lines ({tokens} tokens), median of {rounds} interleaved rounds");
    println!("| path | seconds | lines/s | tokens/s | vs offline |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| `sluice-consumer embed` (offline, model alone) | {a:.2} | {:.0} | {:.0} | 1.00x |",
        n as f64 / a,
        tokens as f64 / a
    );
    println!(
        "| OpenAI batch through sluice-gateway (upload, run, download) | {g:.2} | {:.0} | {:.0} | {:.2}x |",
        n as f64 / g,
        tokens as f64 / g,
        a / g
    );

    println!();
    println!("| round | upload | validate, publish | run | finalize | download | total |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (i, p) in steps.iter().enumerate() {
        println!(
            "| {} | {:.2} s | {} s | {} s | {} s | {:.2} s | {:.2} s |",
            i + 1,
            p.upload,
            p.validate,
            p.run,
            p.finalize,
            p.download,
            through_by_round[i]
        );
    }
    println!();

    // The gateway's memory while a large file streams in and back out.
    let big = dir.path().join("big.jsonl");
    write_big_file(&big, big_mb << 20)?;
    let d = Deployment::start().await?;
    let gateway = d
        .spawn_gateway(KEYS, &[&format!("--max-file-bytes={}", (big_mb + 1) << 20)])
        .await?;
    let pid = gateway.pid().context("gateway pid")?;
    let idle = resident_bytes_of(pid).context("gateway RSS")?;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(idle));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Some(rss) = resident_bytes_of(pid) {
                    peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let base = format!("http://{}/v1", gateway.addr);
    let start = Instant::now();
    let file = upload(&base, &big).await?;
    let up = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let back = dir.path().join("back.jsonl");
    curl(&[
        "-fsS",
        "-o",
        back.to_str().context("path")?,
        "-H",
        &format!("Authorization: Bearer {KEY}"),
        &format!(
            "{base}/files/{}/content",
            file["id"].as_str().context("file id")?
        ),
    ])
    .await?;
    let down = start.elapsed().as_secs_f64();
    sampler.abort();
    ensure!(
        std::fs::metadata(&back)?.len() == std::fs::metadata(&big)?.len(),
        "the download differs in size"
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!();
    println!(
        "sluice-gateway's resident memory while a {big_mb} MiB file streams in and out (sampled every 20 ms)"
    );
    println!("| step | seconds | MiB/s | gateway RSS |");
    println!("| --- | ---: | ---: | ---: |");
    println!("| idle, before | - | - | {:.1} MiB |", mib(idle));
    println!(
        "| upload (POST /v1/files) | {up:.2} | {:.0} | |",
        big_mb as f64 / up
    );
    println!(
        "| download (GET /v1/files/{{id}}/content) | {down:.2} | {:.0} | |",
        big_mb as f64 / down
    );
    println!("| peak over both | | | {:.1} MiB |", mib(peak));
    Ok(())
}

/// Uploads, creates the batch, polls, downloads the output: (lines answered, tokens).
/// Where one batch's time went: seconds measured here for the transfers, the
/// batch object's timestamps (whole seconds) for the gateway's steps.
struct Phases {
    upload: f64,
    validate: i64,
    run: i64,
    finalize: i64,
    download: f64,
}

async fn run_batch(base: &str, requests: &Path, dir: &Path) -> Result<(usize, u64, Phases)> {
    let start = Instant::now();
    let file = upload(base, requests).await?;
    let upload_secs = start.elapsed().as_secs_f64();
    let http = reqwest::Client::new();
    let create = json!({"input_file_id": file["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"});
    let batch: Value = serde_json::from_slice(
        &http
            .post(format!("{base}/batches"))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&create)?)
            .send()
            .await?
            .bytes()
            .await?,
    )?;
    let id = batch["id"].as_str().context("batch id")?.to_string();
    let batch = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let resp = http
            .get(format!("{base}/batches/{id}"))
            .bearer_auth(KEY)
            .send()
            .await?;
        let b: Value = serde_json::from_slice(&resp.bytes().await?)?;
        match b["status"].as_str() {
            Some("completed") => break b,
            Some("failed" | "expired" | "cancelled") => bail!("batch ended {b}"),
            _ => {}
        }
    };
    let at = |name: &str| batch[name].as_i64().unwrap_or(0);
    let out = dir.join("output.jsonl");
    let start = Instant::now();
    curl(&[
        "-fsS",
        "-o",
        out.to_str().context("path")?,
        "-H",
        &format!("Authorization: Bearer {KEY}"),
        &format!(
            "{base}/files/{}/content",
            batch["output_file_id"].as_str().context("output")?
        ),
    ])
    .await?;
    let phases = Phases {
        upload: upload_secs,
        validate: at("in_progress_at") - at("created_at"),
        run: at("finalizing_at") - at("in_progress_at"),
        finalize: at("completed_at") - at("finalizing_at"),
        download: start.elapsed().as_secs_f64(),
    };
    let text = std::fs::read_to_string(&out)?;
    let mut tokens = 0;
    let mut lines = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)?;
        tokens += v["response"]["body"]["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap_or(0);
        lines += 1;
    }
    Ok((lines, tokens, phases))
}

/// `POST /v1/files` with curl, streamed from disk as the SDKs do.
async fn upload(base: &str, path: &Path) -> Result<Value> {
    let out = curl(&[
        "-fsS",
        "-H",
        &format!("Authorization: Bearer {KEY}"),
        "-F",
        "purpose=batch",
        "-F",
        &format!("file=@{}", path.display()),
        &format!("{base}/files"),
    ])
    .await?;
    Ok(serde_json::from_slice(&out)?)
}

async fn curl(args: &[&str]) -> Result<Vec<u8>> {
    let out = tokio::process::Command::new("curl")
        .args(args)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// A batch file of `bytes` bytes, written a line at a time.
fn write_big_file(path: &Path, bytes: u64) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut written = 0u64;
    let mut i = 0u64;
    while written < bytes {
        let line = format!(
            "{{\"custom_id\":\"big-{i}\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{{\"model\":\"all-minilm-l6-v2\",\"input\":\"line {i} of a large batch file, streamed through the gateway in parts\"}}}}\n"
        );
        f.write_all(line.as_bytes())?;
        written += line.len() as u64;
        i += 1;
    }
    f.flush()?;
    Ok(())
}
