//! End-to-end fault tests: real `redis-server`, real Postgres, real `agentq worker`
//! processes; only the LLM (and the HTTP endpoints the `http_fetch` tool calls) is faked.
//! Each test kills, pauses or restarts something at a point it has observed, and checks
//! the durability promises of DESIGN §3 on what the services and the fake saw.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod crash;
mod drain;
mod poison;
mod restart;
mod scale;
mod subagents;
