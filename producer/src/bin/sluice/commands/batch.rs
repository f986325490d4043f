//! `sluice batch`: a gateway's batches, through its API.

use std::process::ExitCode;

use crate::args::*;
use anyhow::Result;
use sluice_producer::batch;

pub(crate) async fn batch_command(cmd: BatchCommand, json: bool) -> Result<ExitCode> {
    let answer = match &cmd {
        BatchCommand::Show { id, gateway } => gateway.client()?.batch(id).await,
        BatchCommand::RetryFailed {
            id,
            completion_window,
            gateway,
        } => {
            gateway
                .client()?
                .retry_failed(id, completion_window.as_deref())
                .await
        }
    };
    match answer {
        Ok(b) => {
            if json {
                println!("{b}");
            } else {
                println!("{}", batch::describe(&b));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if e.is_not_found() => {
            eprintln!("sluice: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e.into()),
    }
}
