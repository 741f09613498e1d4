//! End-to-end fault tests: real `redis-server`, real Postgres, real `agentq worker`
//! processes; only the LLM (and the HTTP endpoints the `http_fetch` tool calls) is faked.
//! Each test kills, pauses or restarts something at a point it has observed, and checks
//! the durability promises on what the services and the fake saw: nothing committed is
//! lost, no answer already checkpointed is asked of the model again, no tool whose result
//! is stored runs twice, and a worker that lost its lease writes nothing more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admission;
mod common;
mod crash;
mod drain;
mod fairshare;
mod forks;
mod limits;
mod liveness;
mod poison;
mod redrive;
mod restart;
mod scale;
mod schedules;
mod shards;
mod subagents;
mod workspace;
mod workspace_s3;
