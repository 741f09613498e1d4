//! What processing one delivery came to ([`Processed`]): the answer of
//! [`crate::Worker::process`], and what each step of settling a delivery returns.

/// What processing one delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed {
    /// The session is terminal (it finished now, or in an earlier run): its parent was
    /// told, its completion published and its entry acknowledged — unless `acked` is
    /// false, when a step failed and the entry stays for a redelivery to settle it.
    Finished { acked: bool },
    /// The run gave the session up to wait (for children, an approval, a message); the
    /// entry is acknowledged and whatever it waits for enqueues it again.
    Suspended,
    /// Stopped at a checkpoint for shutdown: the lease was released, the session put back
    /// on the queue and the entry acknowledged.
    HandedBack,
    /// Another worker took the lease: the run stopped without writing anything more.
    LeaseLost,
    /// Another worker's live lease: the entry is left for that worker (or the reclaimer).
    Busy,
    /// Not runnable now, or unknown: the entry was dropped.
    Dropped,
    /// Delivered too many times without finishing: failed, and moved to the dead-letter
    /// stream.
    DeadLettered,
    /// Another entry of a session running here: it runs once that run has ended.
    Deferred,
    /// This very entry is being processed here already.
    AlreadyRunning,
    /// The store or the queue failed after the claim: the entry stays pending, the lease
    /// expires, and a redelivery resumes from the last checkpoint.
    Left,
}
