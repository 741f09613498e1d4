//! What the Postgres and SQLite stores share, so that the two cannot drift apart: the rows
//! they read and how a row becomes the model ([`record`]), the statements both dialects run
//! from one text with the dialects' differences isolated ([`statements`]), the reads both
//! run alike on their own pools, generic over the database ([`read`], and the dispatcher's
//! in [`dispatch`], the workspace's in [`files`]), the budget statements both run alike
//! ([`ledger`], with the pure ledger arithmetic in [`budget`]; a tenant's totals in
//! [`totals`]), the answers built from what
//! a statement found ([`outcome`]), what a suspension writes ([`suspension`]), the writes
//! both run alike inside a transaction ([`write`]), and the one rule by which both store
//! text Postgres cannot hold, and read it back ([`escape`]); batches as objects of the API
//! have their statements, rows and reads in [`batches`].

pub(crate) mod batches;
pub(crate) mod budget;
pub(crate) mod chain;
pub(crate) mod dispatch;
pub(crate) mod escape;
pub(crate) mod files;
pub(crate) mod fork;
pub(crate) mod ledger;
pub(crate) mod outcome;
pub(crate) mod read;
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod retention;
pub(crate) mod retention_rules;
pub(crate) mod schedules;
pub(crate) mod statements;
pub(crate) mod suspension;
pub(crate) mod totals;
pub(crate) mod webhooks;
pub(crate) mod write;
