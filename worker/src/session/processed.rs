//! What processing one delivery came to ([`Processed`]): the answer of
//! [`crate::Worker::process`], and what each step of settling a delivery returns.

/// What processing one delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed {
    /// The session is terminal (it finished now, or in an earlier run): its parent was
    /// told, its completion published and it was marked announced — unless `acked` is
    /// false, when a step failed and the sweeper settles it again.
    Finished { acked: bool },
    /// The run gave the session up to wait (for children, an approval, a message); the
    /// entry is acknowledged and whatever it waits for enqueues it again.
    Suspended,
    /// Stopped at a checkpoint for shutdown: the lease was released, the session put back
    /// on the queue and the entry acknowledged.
    HandedBack,
    /// Another worker took the lease: the run stopped without writing anything more.
    LeaseLost,
    /// Another worker's live lease: the entry was dropped (the store re-queues the session
    /// if that worker dies).
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
    /// The store or the queue failed after the claim: the heartbeat gives the session back
    /// (or, if this worker dies, the store's liveness re-queues it), and a later run
    /// resumes from the last checkpoint.
    Left,
}
