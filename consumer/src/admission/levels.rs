//! Priority levels in admission: which level's durable consumer the next
//! pull asks first. A level's *charge* is the tokens its jobs used, scaled by
//! the inverse of its weight ([`Priority::weight`], 8 : 4 : 1); the level
//! with the least charge goes first, ties to the higher level. So while
//! several levels have a backlog each gets its weight's share of the token
//! throughput, and with one level alone it gets all of it.
//!
//! A level found empty is lifted to the least charge of the others: it
//! banks no credit while idle, so a level that comes back after an hour
//! takes its share, not the next hour's throughput.

use std::sync::atomic::{AtomicU64, Ordering};

use sluice_schemas::Priority;

/// The charge per token at each level: 8 / weight (1, 2 and 8).
fn scale(p: Priority) -> u64 {
    8 / p.weight()
}

#[derive(Default)]
pub struct LevelShares {
    charge: [AtomicU64; 3],
}

impl LevelShares {
    /// A job at `p` finished having used `tokens`.
    pub fn charge(&self, p: Priority, tokens: u64) {
        self.charge[p.index()].fetch_add(tokens.saturating_mul(scale(p)), Ordering::Relaxed);
    }

    /// `levels` in the order to ask them: least charge first, ties to the
    /// higher level.
    pub fn order(&self, levels: &[Priority]) -> Vec<Priority> {
        let mut order = levels.to_vec();
        order.sort_by_key(|p| (self.charge[p.index()].load(Ordering::Relaxed), *p));
        order
    }

    /// `p` had nothing waiting: lift its charge to the least of `others`.
    pub fn found_empty(&self, p: Priority, others: &[Priority]) {
        if let Some(least) = others
            .iter()
            .filter(|o| **o != p)
            .map(|o| self.charge[o.index()].load(Ordering::Relaxed))
            .min()
        {
            self.charge[p.index()].fetch_max(least, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::*;

    /// Serve whichever level goes first, `tokens` a job, all levels always
    /// backlogged: the tokens split 8 : 4 : 1.
    #[test]
    fn backlogged_levels_share_tokens_eight_four_one() {
        let s = LevelShares::default();
        let all = Priority::ALL;
        let mut served = [0u64; 3];
        for _ in 0..13_000 {
            let first = s.order(&all)[0];
            s.charge(first, 100);
            served[first.index()] += 100;
        }
        let [h, n, l] = served;
        let total = (h + n + l) as f64;
        assert!((h as f64 / total - 8.0 / 13.0).abs() < 0.01, "{h} {n} {l}");
        assert!((n as f64 / total - 4.0 / 13.0).abs() < 0.01, "{h} {n} {l}");
        assert!((l as f64 / total - 1.0 / 13.0).abs() < 0.01, "{h} {n} {l}");
    }

    #[test]
    fn ties_go_to_the_higher_level_and_an_idle_level_banks_nothing() {
        let s = LevelShares::default();
        assert_eq!(s.order(&[Low, Normal, High]), vec![High, Normal, Low]);
        // Low alone for a long time: its charge grows.
        s.charge(Low, 1_000_000);
        // High was idle all along; found empty, it is lifted to the others'
        // least (normal's 0 here: normal was idle too).
        s.found_empty(High, &Priority::ALL);
        assert_eq!(s.order(&Priority::ALL)[0], High);
        // Now normal and high both idle-lifted to low's charge: high arrives
        // and goes first, but low is not starved for an hour after: they
        // alternate by share from here.
        s.found_empty(Normal, &[Low]);
        s.found_empty(High, &[Low]);
        let mut low_served = 0;
        for _ in 0..90 {
            let first = s.order(&Priority::ALL)[0];
            s.charge(first, 100);
            if first == Low {
                low_served += 100;
            }
        }
        assert!(low_served > 0, "low kept its share");
    }
}
