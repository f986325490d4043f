//! Everything a job leaves behind: its output (`store`: inline or S3), its
//! result and dead letters on NATS (`results`), a streaming job's text as
//! it is generated (`stream`), and the `.npy` encoding of
//! embedding outputs (`npy`). Its status record is written through the
//! `sluice-status` crate's `StatusStore`, which the CLI shares.

pub mod results;
pub mod store;
pub mod stream;

pub use results::{DeadLetters, ResultPublisher};
pub use store::OutputStore;
pub use stream::JobStream;
