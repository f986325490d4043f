//! Everything a job leaves behind: its output (`store`: inline or S3), its
//! result and dead letters on NATS (`results`). A streaming generate job's
//! text goes out from its task (`task::generate::stream`). Its status record is written through the
//! `sluice-status` crate's `StatusStore`, which the CLI shares.

pub mod results;
pub mod store;

pub use results::{DeadLetters, ResultPublisher};
pub use store::OutputStore;
