//! All integration tests in one binary (one link, one build).

mod embed;
mod failures;
mod faults;
mod flood;
mod harness;
