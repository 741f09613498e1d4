//! The group commit's statement texts: what a batch that finishes writes, and one text per
//! shape.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use agentq_types::workspace::{BlobRef, FileChange};
use sqlx::Arguments;

use super::super::plan_tests::{key, parameters, step};
use super::*;

/// Checkpoint `n` of a batch: finishing its session or not, changing `files` files.
fn checkpoint(n: u32, finishing: bool, files: usize) -> Checkpoint {
    let mut cp = step(&key(n));
    if finishing {
        cp.finish = Some(crate::checkpoint::Finish {
            status: crate::model::SessionStatus::Completed,
            reason: agentq_agent::spec::ExitReason::Stop,
            result: Some("done".into()),
            error: None,
        });
    }
    for f in 0..files {
        let sha = format!("{n:02}{f:062}");
        cp.files.push(FileChange {
            path: format!("f{f}"),
            blob: Some(BlobRef {
                sha256: sha.clone(),
                size: 1,
            }),
        });
        cp.blobs.push((sha, Arc::new(vec![b'x'])));
    }
    cp
}

/// Every batch of a shape runs its shape's one text, with as many values as it has
/// placeholders, whatever its size: the text written once per shape is the one every
/// such batch would have written.
#[test]
fn a_shape_has_one_text_for_every_batch_of_it() {
    for finishing in [false, true] {
        for files in [0, 1, 2] {
            for size in [1, 2, 3] {
                let cps: Vec<Checkpoint> = (1..=size)
                    .map(|n| checkpoint(n, finishing && n == 1, files))
                    .collect();
                let batch: Vec<&Checkpoint> = cps.iter().collect();
                let columns = BatchColumns::of(&batch);
                let shape = columns.shape();
                let (written, args) = columns.bind(Params::default(), shape).unwrap();
                assert_eq!(parameters(&written), args.len());
                let (text, args) = batch_statement(&batch).unwrap();
                assert_eq!(text, written, "{size} checkpoints, {files} files");
                assert_eq!(args.len(), parameters(text));
            }
        }
    }
}

/// A batch that finishes no session does not name `status` in its `SET` (so that the
/// triggers on `status` changes are not built for it) nor any outcome column; one
/// that finishes a session writes the outcome and returns the row.
#[test]
fn only_a_finishing_batch_writes_the_outcome() {
    let step = checkpoint_batch("c", "m", "", false);
    let set = |sql: &str| {
        let from = sql.find("UPDATE sessions s SET").unwrap_or(0);
        let to = sql.find("FROM locked c").unwrap_or(sql.len());
        sql[from..to].to_owned()
    };
    for column in [
        "status",
        "finish_reason",
        "result",
        "error",
        "finished_at",
        "lease_owner",
    ] {
        assert!(
            !set(&step).contains(&format!("{column} =")),
            "{column} in {step}"
        );
    }
    assert!(!step.contains("c.status"), "{step}");
    let last = checkpoint_batch("c", "m", "", true);
    assert!(
        set(&last).contains("status = COALESCE(c.status, s.status)"),
        "{last}"
    );
    assert!(last.contains("to_json(s.*)"), "{last}");
}
