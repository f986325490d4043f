//! A job's life in the consumer, one file per step:
//!
//! - `pipeline`: one job from pull to settle (decode, check, mark running,
//!   fetch, engine, write the output).
//! - `delivery`: what the message and its headers say, the job id read even
//!   from a job that fails to decode, progress acks while it runs, Naks.
//! - `disposition`: the ack policy as a pure function, table-tested.
//! - `settle`: that decision applied (status, result, ack / Nak / Term).
//! - `cancel`: a running generate job's watch on its status record, so a
//!   cancel stops it before the next generation step.
//! - `dead_letter`: giving up on a job, the exhausted-deliveries backstop and
//!   its advisory listener.

pub mod cancel;
pub mod dead_letter;
pub mod delivery;
pub mod disposition;
pub mod pipeline;
pub mod settle;

pub use delivery::nak_now;
pub use pipeline::handle;
