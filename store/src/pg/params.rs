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
    /// Bind without writing placeholders (every one is empty): for a statement whose text
    /// is already known.
    values_only: bool,
}

impl Params {
    /// Parameters of a statement whose text is known already: binding writes no text.
    pub(super) fn values_only() -> Self {
        Self {
            values_only: true,
            ..Self::default()
        }
    }

    /// Whether binding writes the statement's text (see [`Params::values_only`]).
    pub(super) fn writes_text(&self) -> bool {
        !self.values_only
    }

    /// Bind one value; its placeholder (`$n`).
    pub(super) fn value<'q, T>(&mut self, value: T) -> Result<String>
    where
        T: Encode<'q, Postgres> + Type<Postgres> + 'q,
    {
        Arguments::add(&mut self.args, value).map_err(sqlx::Error::Encode)?;
        self.n += 1;
        if self.values_only {
            return Ok(String::new());
        }
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

    /// A column of a table that has one row (`row` binds its value alone, cast to `ty`,
    /// which Postgres binds and plans for more cheaply than an array of one) or of many
    /// (an array, as [`Params::array`]).
    pub(super) fn column<'q, E>(&mut self, values: &'q [E], ty: &str, row: bool) -> Result<String>
    where
        E: Encode<'q, Postgres> + Type<Postgres> + 'q,
        &'q [E]: Encode<'q, Postgres> + Type<Postgres>,
    {
        match values {
            [one] if row => Ok(format!("{}::{ty}", self.value(one)?)),
            _ => self.array(values, ty),
        }
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

/// `(VALUES (values…)) AS alias(names…)`: a table of one row, its columns bound by
/// [`Params::column`] as single values.
pub(super) fn one_row(alias: &str, columns: &[(&str, String)]) -> String {
    let (values, names) = split(columns);
    format!("(VALUES ({values})) AS {alias}({names})")
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_table_of_one_row_binds_values_and_of_more_binds_arrays() {
        let mut p = Params::default();
        let one = [("id", p.column(&["a"], "text", true).unwrap())];
        assert_eq!(one_row("c", &one), "(VALUES ($1::text)) AS c(id)");
        // Two values make a table of two rows whatever the caller asked.
        let two = [
            ("id", p.column(&["a", "b"], "text", true).unwrap()),
            ("n", p.column(&[1_i64, 2], "bigint", false).unwrap()),
        ];
        assert_eq!(
            unnest("c", &two),
            "UNNEST($2::text[], $3::bigint[]) AS c(id, n)"
        );
    }
}
