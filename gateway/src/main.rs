use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = sluice_gateway::Config::parse();
    config.log.init("info")?;
    sluice_gateway::run(config).await
}
