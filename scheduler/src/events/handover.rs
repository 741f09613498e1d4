//! Which stored events a worker handover abandoned: the events of a step that a later
//! run redid, and those of a paused ("zombie") run that woke up after a newer one began.

use std::collections::{BTreeMap, HashMap};

use super::ids::StreamId;

/// The position and run of one stored event, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKey {
    pub seq: u64,
    pub epoch: i64,
}

/// For events in stream order, whether each is abandoned (see the module docs): it is
/// from an older epoch than one already seen earlier in the stream (a zombie), or a later
/// epoch started at a position at or before its own (the step was redone).
pub fn abandoned(events: &[EventKey]) -> Vec<bool> {
    let mut out = vec![false; events.len()];
    // Zombies first; the starts of epochs are taken among the remaining events only, so
    // a zombie cannot make a live run's events look abandoned.
    let mut max_epoch = i64::MIN;
    let mut start: BTreeMap<i64, u64> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        if e.epoch < max_epoch {
            out[i] = true;
            continue;
        }
        max_epoch = e.epoch;
        start.entry(e.epoch).or_insert(e.seq);
    }
    // For each epoch, the lowest start among later epochs.
    let mut min_later: HashMap<i64, u64> = HashMap::with_capacity(start.len());
    let mut running = u64::MAX;
    for (epoch, s) in start.iter().rev() {
        min_later.insert(*epoch, running);
        running = running.min(*s);
    }
    for (i, e) in events.iter().enumerate() {
        if !out[i] && min_later.get(&e.epoch).is_some_and(|m| *m <= e.seq) {
            out[i] = true;
        }
    }
    out
}

/// What a reconnecting client must be told after catching up: the position to reset
/// from (if some events it received before `last` are abandoned now).
pub fn reset_after(events: &[(StreamId, EventKey)], last: StreamId) -> Option<u64> {
    let keys: Vec<EventKey> = events.iter().map(|(_, k)| *k).collect();
    let now = abandoned(&keys);
    let n_prefix = events.iter().take_while(|(id, _)| *id <= last).count();
    let then = abandoned(&keys[..n_prefix]);
    (0..n_prefix)
        .filter(|i| !then[*i] && now[*i])
        .map(|i| keys[i].seq)
        .min()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn keys(v: &[(u64, i64)]) -> Vec<EventKey> {
        v.iter()
            .map(|(seq, epoch)| EventKey {
                seq: *seq,
                epoch: *epoch,
            })
            .collect()
    }

    #[test]
    fn one_run_keeps_everything() {
        let k = keys(&[(1, 1), (1, 1), (2, 1), (3, 1), (3, 1)]);
        assert_eq!(abandoned(&k), vec![false; 5]);
    }

    #[test]
    fn a_redone_step_abandons_the_old_runs_events_from_its_start() {
        // Run 1 committed positions 1 and 2, was streaming 3 when it died; run 2 redoes 3.
        let k = keys(&[(1, 1), (2, 1), (3, 1), (3, 1), (3, 2), (3, 2), (4, 2)]);
        assert_eq!(
            abandoned(&k),
            vec![false, false, true, true, false, false, false]
        );
    }

    #[test]
    fn a_resume_after_a_commit_abandons_nothing() {
        // Run 1's tool calls at 1 are committed; run 2 starts with the results at 2.
        let k = keys(&[(1, 1), (1, 1), (2, 2), (3, 2)]);
        assert_eq!(abandoned(&k), vec![false; 4]);
    }

    #[test]
    fn several_handovers() {
        // Epoch 1 dies at 2; epoch 2 dies at 4 (its 2..3 committed); epoch 3 redoes 4.
        let k = keys(&[(1, 1), (2, 1), (2, 2), (3, 2), (4, 2), (4, 3), (5, 3)]);
        assert_eq!(
            abandoned(&k),
            vec![false, true, false, false, true, false, false]
        );
        // An epoch that starts lower than an earlier one abandons from there, even for
        // events of epochs in between.
        let k = keys(&[(1, 1), (5, 1), (3, 2), (6, 2), (2, 3)]);
        assert_eq!(abandoned(&k), vec![false, true, true, true, false]);
    }

    #[test]
    fn a_zombie_is_dropped_and_does_not_abandon_others() {
        // Epoch 1 was paused mid-step at 3; epoch 2 took over and redid 3; then epoch 1
        // woke up and appended more (at 3 and even at a fresh-looking 9).
        let k = keys(&[(3, 1), (3, 2), (4, 2), (3, 1), (9, 1), (5, 2)]);
        assert_eq!(abandoned(&k), vec![true, false, false, true, true, false]);
        // A zombie at a low position does not count as an epoch start.
        let k = keys(&[(5, 2), (6, 2), (1, 1)]);
        assert_eq!(abandoned(&k), vec![false, false, true]);
    }

    #[test]
    fn reconnecting_after_abandoned_events_resets() {
        let id = |n: u64| StreamId(n, 0);
        let ev = |n: u64, seq: u64, epoch: i64| (id(n), EventKey { seq, epoch });
        // The client saw up to entry 4 (run 1 streaming position 3); run 2 redid 3.
        let events = vec![
            ev(1, 1, 1),
            ev(2, 2, 1),
            ev(3, 3, 1),
            ev(4, 3, 1),
            ev(5, 3, 2),
            ev(6, 4, 2),
        ];
        assert_eq!(reset_after(&events, id(4)), Some(3));
        // It saw only committed work: no reset.
        assert_eq!(reset_after(&events, id(2)), None);
        // It saw the new run already.
        assert_eq!(reset_after(&events, id(5)), None);
    }
}
