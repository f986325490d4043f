use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = sluice_gateway::Config::parse();
    sluice_gateway::init_logging(&config.log_filter);
    sluice_gateway::run(config).await
}
