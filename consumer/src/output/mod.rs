//! Everything a job leaves behind: its output (`store`: inline or S3), its
//! result and dead letters on NATS (`results`), its status record
//! (`status`), and the `.npy` encoding of embedding outputs (`npy`).

pub mod npy;
pub mod results;
pub mod status;
pub mod store;

pub use results::{DeadLetters, ResultPublisher};
pub use status::StatusStore;
pub use store::OutputStore;
