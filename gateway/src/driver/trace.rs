//! The batch's trace: one span per driver step, and the batch's own span
//! once it has ended.

use std::time::SystemTime;

use opentelemetry::KeyValue;

use crate::batch_record::BatchRecord;
use crate::state::AppState;
use crate::traces::at_unix;

/// Records one of the driver's steps, from `began` to now, in the batch's trace.
pub fn step(
    state: &AppState,
    batch: &BatchRecord,
    name: &'static str,
    began: SystemTime,
    mut attributes: Vec<KeyValue>,
) {
    attributes.push(KeyValue::new("sluice.openai_batch.id", batch.id.clone()));
    state.traces.batch_step(
        batch.traceparent.as_deref(),
        name,
        began,
        SystemTime::now(),
        attributes,
    );
}

/// Records the batch's own span, from its creation to now, once it has ended.
pub fn end(state: &AppState, batch: &BatchRecord) {
    let counts = &batch.request_counts;
    step(
        state,
        batch,
        "sluice.openai_batch",
        at_unix(batch.created_at),
        vec![
            KeyValue::new("sluice.tenant", batch.tenant.clone()),
            KeyValue::new("sluice.openai_batch.endpoint", batch.endpoint.clone()),
            KeyValue::new("sluice.openai_batch.status", batch.status.as_str()),
            KeyValue::new("sluice.openai_batch.total", counts.total as i64),
            KeyValue::new("sluice.openai_batch.completed", counts.completed as i64),
            KeyValue::new("sluice.openai_batch.failed", counts.failed as i64),
        ],
    );
}
