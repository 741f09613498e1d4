//! The history of a session that may be a fork, as one statement's text: the chain of the
//! session and its origins (`super::fork`), each link giving its own messages below the
//! position where the next took over. Text only, so that both `super::statements` and
//! `super::fork` build on it.

/// The chain of `$1` and its origins: each link's own messages below `hi` belong to the
/// history (`hi` NULL: all of them). The depth bound only stops a corrupt cycle.
macro_rules! chain {
    () => {
        "WITH RECURSIVE chain(root_id, id, origin, lo, hi, depth) AS ( \
           SELECT root_id, id, forked_from, fork_at, CAST(NULL AS integer), 0 \
           FROM sessions WHERE id = $1 \
           UNION ALL \
           SELECT o.root_id, o.id, o.forked_from, o.fork_at, c.lo, c.depth + 1 \
           FROM sessions o JOIN chain c ON o.id = c.origin WHERE c.depth < 64) "
    };
}

/// The messages of a chain, for a `FROM`: `seq` and `body` of each.
macro_rules! chain_messages {
    () => {
        "chain c JOIN messages m ON m.root_id = c.root_id::uuid AND m.session_id = c.id::uuid \
         WHERE (c.hi IS NULL OR m.seq < c.hi) "
    };
}
pub(crate) use {chain, chain_messages};

/// A session's history for reading, a fork's included (a chain of one link is a session
/// that is no fork): the LEFT JOIN tells a missing session (no row) from a history of the
/// prompt alone (NULL seq), and brings, on the first row only, the spec for message 0's
/// prompt (whole: Postgres refuses to take a field out of a JSON document holding
/// `\u0000`, which a spec stored before the stores escaped NUL may hold).
pub(crate) const HISTORY: &str = concat!(
    chain!(),
    "SELECT CASE WHEN row_number() OVER (ORDER BY m.seq) = 1 THEN p.spec END, \
                m.seq, m.body FROM sessions s \
         JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id \
         LEFT JOIN (SELECT m.seq, m.body FROM ",
    chain_messages!(),
    ") m ON true WHERE s.id = $1 ORDER BY m.seq"
);
