//! All integration tests in one binary (one link, one build).

mod embed;
mod flood;
mod harness;
