//! `sluice-consumer`: parse the config, start logging, run.

use clap::{Parser, Subcommand};
use sluice_connect::LogArgs;
use sluice_consumer::config::Config;
use sluice_consumer::device_check::{self, DeviceCheckArgs};
use sluice_consumer::offline::{EmbedArgs, RerankArgs, embed_file, rerank_file};
use sluice_consumer::offline_generate::{GenerateArgs, generate_file};

#[derive(Parser)]
#[command(
    name = "sluice-consumer",
    version,
    about = "Pulls inference jobs from NATS JetStream within a memory budget, batches them by token sum, runs the model, writes results to S3.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: Config,
}

#[derive(Subcommand)]
enum Command {
    /// Run the model alone on a local JSONL file and write a .npy (no NATS, no S3).
    Embed(EmbedArgs),
    /// Score a local JSONL file of {"query", "document"} pairs with a
    /// cross-encoder (--model-dir) and write the scores as a .npy (no NATS, no S3).
    Rerank(RerankArgs),
    /// Generate from a local JSONL file of prompts with a GGUF model
    /// (--model-dir) and print each answer with its token ids and their
    /// logprobs, one JSON line per prompt (no NATS, no S3).
    Generate(GenerateArgs),
    /// Check a device from a bundle of scripts/device-bundle: budget, embeddings
    /// against the reference, throughput, decode tokens/s, peak memory (one table).
    DeviceCheck(DeviceCheckArgs),
    /// Write a device bundle's model files (scripts/device-bundle runs it).
    #[command(hide = true)]
    DeviceBundleModels {
        /// The MiniLM folder to copy with f16 weights.
        #[arg(long)]
        minilm: std::path::PathBuf,
        /// The GGUF whose header (metadata, tokenizer, tensor shapes) to copy.
        #[arg(long)]
        gguf: std::path::PathBuf,
        /// The bundle folder.
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Embed(args)) => {
            LogArgs::default().init("info")?;
            let report = tokio::task::spawn_blocking(move || embed_file(&args)).await??;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Some(Command::Rerank(args)) => {
            LogArgs::default().init("info")?;
            let report = tokio::task::spawn_blocking(move || rerank_file(&args)).await??;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Some(Command::Generate(args)) => {
            LogArgs::default().init("info")?;
            tokio::task::spawn_blocking(move || {
                generate_file(&args, &mut std::io::stdout().lock())
            })
            .await??;
            Ok(())
        }
        Some(Command::DeviceCheck(args)) => {
            LogArgs::default().init("info")?;
            let report = tokio::task::spawn_blocking(move || device_check::run(&args)).await??;
            print!("{}", report.table());
            if !report.passed() {
                anyhow::bail!("device-check: a check failed (the table says which)");
            }
            Ok(())
        }
        Some(Command::DeviceBundleModels { minilm, gguf, out }) => {
            device_check::write_minilm_f16(&minilm, &out.join(device_check::BUNDLE_MINILM))?;
            device_check::write_gguf_header(&gguf, &out.join(device_check::BUNDLE_LLAMA_HEADER))?;
            Ok(())
        }
        None => {
            cli.config.log.init("info")?;
            sluice_consumer::run(cli.config).await
        }
    }
}
