//! The relay behind `GET /v1/sessions/{id}/events`: a session's events as server-sent
//! events, replayed from the session's stream `agentq:events:<id>` and then tailed live,
//! resumable with `Last-Event-ID`.
//!
//! Every event carries `id:` = its Redis stream entry id, `event:` = its `type`, and
//! `data:` = the event's JSON with `seq` (the history position it belongs to) added.
//!
//! Worker handovers. When the worker running a session dies mid-step, the next run (a
//! higher lease epoch) redoes the uncommitted step from the committed history length: the
//! stream then holds events of work that was thrown away. Those are *abandoned* and never
//! sent ([`abandoned`]): an event (seq `s`, epoch `e`) is abandoned when a later epoch's
//! first event has a seq ≤ `s`, and so is any event of an older epoch stored after a newer
//! epoch began (a paused "zombie" worker that woke up). A replay is therefore exactly the
//! stream an uninterrupted run would have produced.
//!
//! Live, an abandoned step may already have been sent when the next run begins. The
//! server then sends `event: reset` with `data: {"seq": s0}` (and no `id`): the client
//! must discard what it received for positions ≥ `s0`; the redone step follows. The same
//! happens on a reconnect whose `Last-Event-ID` lies after events that have since been
//! abandoned.
//!
//! Without a stream (expired 24 h after the session ended, or lost with Redis), the events
//! are rebuilt from the stored transcript, with ids `t-<seq>-<k>`, and the live tail
//! follows for a session still running. A stream trimmed by its cap (`MAXLEN ~ 20000`)
//! replays from its oldest retained event; `/messages` has the full history.
//!
//! The stream ends after `session_completed` once the session is terminal in the store
//! (or, for a terminal session whose worker never wrote that event, after a short grace
//! with one rebuilt from the row), and when the scheduler shuts down.
//!
//! The parts: event ids and where a client stopped ([`StreamId`], [`LastId`]), which
//! stored events a handover abandoned ([`abandoned`], [`reset_after`]), the events rebuilt
//! from a transcript ([`transcript_events`]), and one client's relay (`relay`: the
//! replay of what is stored, `replay`, then the live tail, `tail`), and the fan-out that
//! follows every client's session over a few Redis connections (`hub`).
//!
//! Connections. Replays and catch-up reads go through the queue's shared command
//! connection; live events come from the hub's readers, a fixed few per scheduler
//! whatever the number of clients (see `hub`). A client that cannot keep up with its
//! session is caught up at its own pace, never waited for by the others.

pub(crate) mod caps;
mod handover;
mod hub;
mod ids;
mod relay;
mod replay;
mod tail;
mod transcript;

pub(crate) use caps::StreamCaps;
pub use caps::StreamLimits;
pub use handover::{EventKey, abandoned, reset_after};
pub(crate) use hub::Hub;
pub use hub::READERS;
pub use ids::{LastId, StreamId};
pub(crate) use relay::follow;
pub use transcript::transcript_events;
