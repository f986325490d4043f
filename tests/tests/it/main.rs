//! All integration tests in one binary (one link, one build).

mod cli;
mod embed;
mod failures;
mod faults;
mod flood;
mod harness;
mod observability;
mod publishers;
