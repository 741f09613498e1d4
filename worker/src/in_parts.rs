//! A batch sent to the store as a whole, or in parts when the store refuses it as a whole:
//! what the group commit and the group claim share.

use std::future::Future;
use std::sync::Arc;

use tracing::debug;

use agentq_core::{Error, Result};

/// Sends `batch` to the store (`send`, given each item's `key`) and gives every item its
/// answer (`answer`). A part the store will never take as it is (a value it refuses, a
/// row it cannot decode: not an outage) is split in two and each half sent on its own, so
/// that only the item at fault fails, after about 2·log2(n) more statements, and every
/// other one of the batch is answered in the same round. Any other failure is each item's:
/// nothing of the part may be assumed done, and each retries on its own schedule. A store
/// that answers a different number of items than it was sent fails the whole part.
pub(crate) async fn in_parts<J, K, T, Fut>(
    batch: Vec<J>,
    what: &str,
    key: impl Fn(&J) -> K,
    send: impl Fn(Vec<K>) -> Fut,
    answer: impl Fn(J, Result<T>),
) where
    Fut: Future<Output = Result<Vec<Result<T>>>>,
{
    let mut parts = vec![batch];
    while let Some(mut part) = parts.pop() {
        let keys = part.iter().map(&key).collect();
        match send(keys).await {
            Ok(answers) if answers.len() == part.len() => {
                for (item, a) in part.into_iter().zip(answers) {
                    answer(item, a);
                }
            }
            Ok(answers) => {
                let e = Error::Conflict(format!(
                    "the store answered {} of {} items of a {what}",
                    answers.len(),
                    part.len()
                ));
                fail(part, e, &answer);
            }
            Err(e) if part.len() > 1 && !e.is_retryable() => {
                debug!(error = %e, size = part.len(), "{what} refused as a whole; splitting it");
                let second = part.split_off(part.len() / 2);
                parts.push(second);
                parts.push(part);
            }
            Err(e) => fail(part, e, &answer),
        }
    }
}

fn fail<J, T>(part: Vec<J>, e: Error, answer: &impl Fn(J, Result<T>)) {
    let e = Arc::new(e);
    for item in part {
        answer(item, Err(Error::Shared(e.clone())));
    }
}
