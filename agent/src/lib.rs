//! agentq-agent: the agent loop, provider-neutral and tool-neutral.
//!
//! This crate owns the internal schema ([`schema`]), the two extension traits
//! ([`provider::LlmProvider`], [`tools::Tool`]), the loop state machine ([`state`]) and the
//! driver that performs its I/O ([`driver`]), the gate every LLM call passes
//! ([`admission`]), the guard pipeline ([`guard`]) and the built-in providers and tools.
//! It knows nothing of Redis or SQL: persistence happens through the
//! [`driver::Checkpointer`] it is handed.

pub mod admission;
pub mod bounds;
pub mod driver;
pub mod error;
pub mod event;
pub mod guard;
pub mod observe;
pub mod provider;
pub mod schema;
pub mod spec;
pub mod state;
pub mod tools;

pub use error::{CheckpointFailure, Error, ErrorClass, Result};
