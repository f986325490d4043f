//! The batcher: one task owns the queue of ready items (from any job) and
//! forms batches whose padded cost, `items x longest`, stays under
//! `max_batch_tokens`, grouping items of similar length. A batch leaves when
//! the queue holds a full batch's worth of tokens, or when its oldest item has
//! waited `max_wait`. See `batcher.md` for the reasoning.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::error::JobError;
use crate::telemetry::BatchFigures;

/// One item (a text's token ids, or a pair's with their types) on its way
/// to the model.
#[derive(Debug)]
pub struct BatchItem {
    pub ids: Vec<u32>,
    /// rerank: each token's type (as long as `ids`); embed: none.
    pub type_ids: Option<Vec<u32>>,
    /// Position of the item in its job.
    pub index: usize,
    /// Where the item's vector goes.
    pub job: mpsc::UnboundedSender<ItemOutcome>,
    /// When the item became ready (tokenized).
    pub ready_at: Instant,
    /// The job's span, for the batch span's links (None: tracing is off).
    pub trace: Option<opentelemetry::trace::SpanContext>,
}

/// What the executor sends back for each item.
#[derive(Debug)]
pub enum ItemOutcome {
    Done {
        index: usize,
        vector: Vec<f32>,
        batch: BatchReport,
    },
    Failed {
        index: usize,
        error: JobError,
    },
}

/// A batch as a job sees it, for its timings.
#[derive(Debug, Clone, Copy)]
pub struct BatchReport {
    pub id: u64,
    pub started: Instant,
    pub model_ms: f64,
}

/// A batch for the executor.
#[derive(Debug)]
pub struct Batch {
    pub id: u64,
    pub items: Vec<BatchItem>,
}

impl Batch {
    pub fn padded_len(&self) -> usize {
        self.items.iter().map(|i| i.ids.len()).max().unwrap_or(0)
    }
    pub fn padded_tokens(&self) -> usize {
        self.items.len() * self.padded_len()
    }
    pub fn real_tokens(&self) -> usize {
        self.items.iter().map(|i| i.ids.len()).sum()
    }
    /// The batch's shape for the metrics.
    pub fn figures(&self) -> BatchFigures {
        let mut lens = self.items.iter().map(|i| i.ids.len());
        let first = lens.next().unwrap_or(0);
        BatchFigures {
            id: self.id,
            items: self.items.len(),
            padded_len: self.padded_len(),
            padded_tokens: self.padded_tokens(),
            real_tokens: self.real_tokens(),
            multi_job: self
                .items
                .iter()
                .any(|i| !i.job.same_channel(&self.items[0].job)),
            mixed_length: lens.any(|l| l != first),
        }
    }
}

/// The longest item of a batch is at most this many times its shortest:
/// padding a 10-token item to 200 wastes more compute than a second batch costs.
pub const MAX_LENGTH_SPREAD: usize = 2;
/// Items up to this many tokens batch together whatever their spread.
pub const SHORT_ITEM: usize = 16;

/// Ready items, ordered by length (to group similar lengths) and by age (so
/// the oldest item always goes in the next batch and nothing starves).
#[derive(Default)]
pub struct Queue {
    by_len: BTreeMap<(usize, u64), BatchItem>,
    by_age: BTreeMap<u64, usize>,
    next_seq: u64,
    tokens: usize,
}

impl Queue {
    pub fn push(&mut self, item: BatchItem) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let len = item.ids.len();
        self.tokens += len;
        self.by_age.insert(seq, len);
        self.by_len.insert((len, seq), item);
    }

    pub fn len(&self) -> usize {
        self.by_len.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_len.is_empty()
    }

    /// Real tokens queued.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn oldest_ready_at(&self) -> Option<Instant> {
        let (&seq, &len) = self.by_age.first_key_value()?;
        self.by_len.get(&(len, seq)).map(|i| i.ready_at)
    }

    fn take(&mut self, key: (usize, u64)) -> Option<BatchItem> {
        let item = self.by_len.remove(&key)?;
        self.by_age.remove(&key.1);
        self.tokens -= key.0;
        Some(item)
    }

    /// The next batch: the oldest item, then the nearest lengths around it
    /// while `items x longest <= max_batch_tokens` and the lengths stay within
    /// [`MAX_LENGTH_SPREAD`] of each other. Items whose job has gone (failed
    /// elsewhere) are dropped on the way.
    pub fn next_batch(&mut self, max_batch_tokens: usize) -> Vec<BatchItem> {
        let mut batch = Vec::new();
        let first = loop {
            let Some((&seq, &len)) = self.by_age.first_key_value() else {
                return batch;
            };
            if let Some(item) = self.take((len, seq))
                && !item.job.is_closed()
            {
                break (len, seq, item);
            }
        };
        let (len0, seq0, item) = first;
        let (mut shortest, mut longest) = (len0, len0);
        batch.push(item);
        loop {
            let below = self
                .by_len
                .range(..(len0, seq0))
                .next_back()
                .map(|(k, _)| *k);
            let above = self.by_len.range((len0, seq0)..).next().map(|(k, _)| *k);
            let fits = |len: usize| {
                let (lo, hi) = (shortest.min(len), longest.max(len));
                (batch.len() + 1) * hi <= max_batch_tokens
                    && hi <= (lo * MAX_LENGTH_SPREAD).max(SHORT_ITEM)
            };
            // The nearer length first; a shorter one never raises the padding.
            let mut candidates = [below, above];
            if let (Some(b), Some(a)) = (below, above)
                && a.0 - len0 < len0 - b.0
            {
                candidates = [above, below];
            }
            let Some(key) = candidates.into_iter().flatten().find(|&(len, _)| fits(len)) else {
                return batch;
            };
            if let Some(item) = self.take(key)
                && !item.job.is_closed()
            {
                shortest = shortest.min(key.0);
                longest = longest.max(key.0);
                batch.push(item);
            }
        }
    }
}

/// Runs the batcher until `items` closes and the queue is empty.
pub async fn run(
    mut items: mpsc::Receiver<BatchItem>,
    executor: mpsc::Sender<Batch>,
    max_batch_tokens: usize,
    max_wait: Duration,
) {
    let mut queue = Queue::default();
    let mut open = true;
    let mut next_id = 0u64;
    loop {
        // Take everything already waiting, so a busy inbox cannot starve sending.
        while let Ok(item) = items.try_recv() {
            queue.push(item);
        }
        if !open && queue.is_empty() {
            return;
        }
        let oldest = queue.oldest_ready_at();
        let due = oldest.map(|t| t + max_wait);
        let ready = !queue.is_empty()
            && (!open
                || queue.tokens() >= max_batch_tokens
                || due.is_some_and(|d| d <= Instant::now()));
        tokio::select! {
            item = items.recv(), if open => match item {
                Some(item) => queue.push(item),
                None => open = false,
            },
            permit = executor.reserve(), if ready => {
                let Ok(permit) = permit else { return };
                let batch = queue.next_batch(max_batch_tokens);
                if !batch.is_empty() {
                    permit.send(Batch { id: next_id, items: batch });
                    next_id += 1;
                }
            },
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now).into()), if !ready && due.is_some() => {},
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn item(len: usize, tx: &mpsc::UnboundedSender<ItemOutcome>) -> BatchItem {
        BatchItem {
            ids: vec![1; len],
            type_ids: None,
            index: len,
            job: tx.clone(),
            ready_at: Instant::now(),
            trace: None,
        }
    }

    #[test]
    fn batches_stay_under_the_budget_and_group_similar_lengths() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut q = Queue::default();
        let lens = [5, 200, 7, 190, 6, 210, 8, 9, 195, 5, 120, 64, 66, 63];
        for &l in &lens {
            q.push(item(l, &tx));
        }
        let mut seen = 0;
        let mut batches = Vec::new();
        while !q.is_empty() {
            let b = q.next_batch(512);
            assert!(!b.is_empty());
            let longest = b.iter().map(|i| i.ids.len()).max().unwrap();
            let shortest = b.iter().map(|i| i.ids.len()).min().unwrap();
            assert!(b.len() * longest <= 512, "batch over budget");
            assert!(
                longest <= (2 * shortest).max(16),
                "lengths {shortest}..{longest} in one batch"
            );
            seen += b.len();
            batches.push(b.iter().map(|i| i.ids.len()).collect::<Vec<_>>());
        }
        assert_eq!(seen, lens.len());
        // The oldest item (5) leads the first batch, with the short items.
        assert_eq!(batches[0][0], 5);
        assert!(batches[0].iter().all(|&l| l <= 9), "{batches:?}");
        assert_eq!(q.tokens(), 0);
    }

    #[test]
    fn the_oldest_item_always_goes_next() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut q = Queue::default();
        q.push(item(250, &tx));
        for _ in 0..100 {
            q.push(item(3, &tx));
        }
        let b = q.next_batch(256);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].ids.len(), 250);
    }

    #[test]
    fn items_of_gone_jobs_are_dropped() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (live, _live_rx) = mpsc::unbounded_channel();
        let mut q = Queue::default();
        q.push(item(4, &tx));
        q.push(item(4, &live));
        drop(rx);
        let b = q.next_batch(100);
        assert_eq!(b.len(), 1);
        assert!(!b[0].job.is_closed());
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn flushes_on_max_wait_and_when_full() {
        let (item_tx, item_rx) = mpsc::channel(16);
        let (exec_tx, mut exec_rx) = mpsc::channel(1);
        let task = tokio::spawn(run(item_rx, exec_tx, 100, Duration::from_millis(50)));
        let (tx, _rx) = mpsc::unbounded_channel();
        let t0 = Instant::now();
        item_tx.send(item(10, &tx)).await.unwrap();
        let b = exec_rx.recv().await.unwrap();
        assert_eq!(b.items.len(), 1);
        assert!(
            t0.elapsed() >= Duration::from_millis(45),
            "flushed before max_wait"
        );
        // A full batch's worth leaves without waiting.
        for _ in 0..10 {
            item_tx.send(item(10, &tx)).await.unwrap();
        }
        let t1 = Instant::now();
        let b = exec_rx.recv().await.unwrap();
        assert_eq!(b.padded_tokens(), 100);
        assert!(
            t1.elapsed() < Duration::from_millis(45),
            "a full batch waited"
        );
        drop(item_tx);
        task.await.unwrap();
    }
}
