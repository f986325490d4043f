//! `sluice-consumer`: parse the config, start logging, run.

use clap::{Parser, Subcommand};
use sluice_consumer::config::{Config, LogFormat};
use sluice_consumer::offline::{EmbedArgs, embed_file};

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Embed(args)) => {
            sluice_consumer::init_logging(LogFormat::Human);
            let report = tokio::task::spawn_blocking(move || embed_file(&args)).await??;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        None => {
            sluice_consumer::init_logging(cli.config.log_format);
            sluice_consumer::run(cli.config).await
        }
    }
}
