//! Backpressure: the bytes in flight from one peer to the other are
//! bounded.
//!
//! A reader takes a permit for each frame before it hands the frame on, and
//! the permit travels with the frame until the writer on the other side has
//! written it. When the other peer stops reading, the writer stops, the
//! permits run out, the reader stops reading, and the pipe from the sender
//! fills: a slow editor slows the agent (and the reverse) instead of
//! growing the bridge. The event loop itself never waits for a permit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bytes of frames in flight one way, when nothing is set: with the
/// largest frame above it (which takes the whole budget, alone), the
/// bridge holds at most this plus one frame per direction.
pub const DEFAULT_BYTES: usize = 4 << 20;

/// A frame's share of its direction's budget, released when dropped.
pub type Permit = OwnedSemaphorePermit;

#[derive(Clone, Debug)]
pub struct Budget {
    permits: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let total = bytes.clamp(1, Semaphore::MAX_PERMITS);
        Budget {
            permits: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Waits until a frame of `len` bytes may be in flight. A frame larger
    /// than the whole budget waits for all of it.
    pub async fn take(&self, len: usize) -> Permit {
        self.permits
            .clone()
            .acquire_many_owned(self.cost(len))
            .await
            .expect("the budget's semaphore is never closed")
    }

    /// A permit for a frame of `len` bytes if one is free now, without
    /// waiting (the readers' fast path).
    pub fn try_take(&self, len: usize) -> Option<Permit> {
        self.permits
            .clone()
            .try_acquire_many_owned(self.cost(len))
            .ok()
    }

    /// What a frame of `len` bytes takes: a frame larger than the whole
    /// budget takes all of it.
    fn cost(&self, len: usize) -> u32 {
        len.clamp(1, self.total) as u32
    }

    /// Bytes not in flight now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_wait_until_earlier_ones_are_written() {
        let b = Budget::new(100);
        let first = b.take(60).await;
        let second = b.take(40).await;
        assert_eq!(b.available(), 0);
        // A third waits for room; a frame above the whole budget takes all.
        let third = tokio::time::timeout(std::time::Duration::from_millis(50), b.take(1)).await;
        assert!(third.is_err());
        drop((first, second));
        let huge = b.take(10_000).await;
        assert_eq!(b.available(), 0);
        drop(huge);
        assert_eq!(b.available(), 100);
    }
}
