//! All integration tests in one binary (one link, one build).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test reports by panicking

mod answer_once;
mod architecture;
mod auth;
mod bounds;
mod classify;
mod cli;
mod deploy_files;
mod device_check;
mod embed;
mod embed_answers;
mod expiry;
mod failures;
mod families;
mod faults;
mod flood;
mod gateway;
mod generate_jobs;
mod harness;
mod lifecycle;
mod logprobs;
mod models;
mod observability;
mod online;
mod priorities;
mod publishers;
mod recycle;
mod rerank;
mod responses;
mod soak;
mod status;
mod streaming;
mod structured;
mod tenants;
mod transcribe;
