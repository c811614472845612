//! The bytes a run may have its tools server hold: requests being
//! answered and answers the script has not read yet, across its
//! connections. Each request holds its own size and the largest answer it
//! could get until it is answered, then its answer's size until that is
//! written to the script; past the budget no more of the run's requests
//! are read, so a script that does not read its answers stalls itself and
//! cannot grow the server's memory.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ToolLimits;

/// The least budget of a run, whatever its limits.
const MIN_BUDGET: usize = 16 << 20;
/// Room in an answer beyond the tool's value (an error's message).
const ENVELOPE: usize = 64 << 10;

/// One run's budget, counted in KiB.
pub struct Budget {
    kib: Arc<Semaphore>,
    total_kib: usize,
    max_answer: usize,
}

impl Budget {
    /// [`MIN_BUDGET`], or more when the limits let calls return more: what
    /// up to eight calls at once can return, and one request.
    pub fn for_limits(limits: &ToolLimits) -> Budget {
        let max_answer = limits.max_bytes.saturating_add(ENVELOPE);
        let line = limits.max_bytes.saturating_add(4096);
        let calls = limits.concurrent.clamp(1, 8) + 1;
        // The semaphore is asked for KiB in a u32.
        let most = (u32::MAX as usize).saturating_mul(1024);
        let bytes = MIN_BUDGET
            .max(max_answer.saturating_mul(calls).saturating_add(line))
            .min(most);
        Budget {
            kib: Arc::new(Semaphore::new(bytes / 1024)),
            total_kib: bytes / 1024,
            max_answer,
        }
    }

    /// The largest answer a request can get, envelope included.
    pub fn max_answer(&self) -> usize {
        self.max_answer
    }

    fn kib(&self, bytes: usize) -> usize {
        bytes.div_ceil(1024).clamp(1, self.total_kib)
    }

    /// Waits until the budget has `bytes` more, and holds them.
    pub async fn hold(&self, bytes: usize) -> OwnedSemaphorePermit {
        let kib = self.kib(bytes) as u32;
        // Never closed: a permit always comes.
        self.kib
            .clone()
            .acquire_many_owned(kib)
            .await
            .expect("the budget is never closed")
    }

    /// `held`, made to hold `bytes` (an answer, once its size is known).
    pub async fn rehold(
        &self,
        mut held: OwnedSemaphorePermit,
        bytes: usize,
    ) -> OwnedSemaphorePermit {
        let (want, have) = (self.kib(bytes), held.num_permits());
        if want < have {
            drop(held.split(have - want));
        } else if want > have {
            held.merge(self.hold((want - have) * 1024).await);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_is_held_is_counted_until_let_go_and_an_answer_holds_its_own_size() {
        let b = Budget::for_limits(&ToolLimits::default());
        assert_eq!(b.kib.available_permits(), MIN_BUDGET / 1024);
        let held = b.hold(b.max_answer() + 100).await;
        assert_eq!(held.num_permits(), (b.max_answer() + 100).div_ceil(1024));
        let held = b.rehold(held, 10).await;
        assert_eq!(held.num_permits(), 1);
        assert_eq!(b.kib.available_permits(), MIN_BUDGET / 1024 - 1);
        drop(held);
        assert_eq!(b.kib.available_permits(), MIN_BUDGET / 1024);
        // Raised limits raise it: eight of the largest answers, and a request.
        let big = ToolLimits {
            max_bytes: 8 << 20,
            ..ToolLimits::default()
        };
        let b = Budget::for_limits(&big);
        assert!(b.kib.available_permits() * 1024 >= 9 * (8 << 20));
    }
}
