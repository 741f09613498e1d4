//! agentq-queue: the `Queue` (work to do and news, [`queue`]) and its two backends, Redis
//! Streams ([`redis_queue`]) and, for the embedded mode, in process ([`mem_queue`]), held
//! to the same behaviour by one contract suite. Re-exported by agentq-core under the same
//! module names.

pub mod mem_queue;
pub mod queue;
pub mod redis_queue;

pub use queue::{EventStreams, Queue, QueueHealth, Signals, WorkQueue};
