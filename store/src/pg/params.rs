//! Parameters of the array-driven statements (the group commit, the heartbeat, batched
//! creation), bound through one builder: binding a value answers the placeholder that
//! names it, so the statement text and its arguments are written together and no
//! parameter number is counted by hand.

use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Encode, Postgres, Type};

use crate::error::Result;

/// A statement's parameters, numbered in the order they are bound.
#[derive(Default)]
pub(super) struct Params {
    args: PgArguments,
    n: usize,
}

impl Params {
    /// Bind one value; its placeholder (`$n`).
    pub(super) fn value<'q, T>(&mut self, value: T) -> Result<String>
    where
        T: Encode<'q, Postgres> + Type<Postgres> + 'q,
    {
        Arguments::add(&mut self.args, value).map_err(sqlx::Error::Encode)?;
        self.n += 1;
        Ok(format!("${}", self.n))
    }

    /// Bind one array (one element per row) of SQL type `ty[]`; its placeholder, cast to
    /// it (`$n::ty[]`).
    pub(super) fn array<'q, T>(&mut self, values: T, ty: &str) -> Result<String>
    where
        T: Encode<'q, Postgres> + Type<Postgres> + 'q,
    {
        Ok(format!("{}::{ty}[]", self.value(values)?))
    }

    /// The arguments, for `sqlx::query_with` and its kin.
    pub(super) fn into_args(self) -> PgArguments {
        self.args
    }
}

/// `UNNEST(arrays…) AS alias(names…)`: a table of parallel arrays, one column each.
pub(super) fn unnest(alias: &str, columns: &[(&str, String)]) -> String {
    let (arrays, names) = split(columns);
    format!("UNNEST({arrays}) AS {alias}({names})")
}

/// [`unnest`] with each row's position (from 1) as its last column, `ord`.
pub(super) fn unnest_ordered(alias: &str, columns: &[(&str, String)]) -> String {
    let (arrays, names) = split(columns);
    format!("UNNEST({arrays}) WITH ORDINALITY AS {alias}({names}, ord)")
}

/// The placeholders and the column names, each joined for a list.
fn split(columns: &[(&str, String)]) -> (String, String) {
    let arrays: Vec<&str> = columns.iter().map(|(_, p)| p.as_str()).collect();
    let names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
    (arrays.join(", "), names.join(", "))
}
