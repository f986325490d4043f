//! One file per command group.

pub(crate) mod batch;
pub(crate) mod dlq;
pub(crate) mod submit;
pub(crate) mod wait;
