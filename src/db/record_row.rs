//! The columns of a record row, listed once. `records` holds each record's current state and
//! `record_revisions` its superseded ones, with the same columns (the history keys them by
//! `record_id` and does not repeat the owner). From the one list in [`record_columns!`] come the
//! columnar batch a commit writes ([`Rows`], one [`Row`] at a time), the binary COPY of new rows
//! (a push's and the Go import's), the unnest of a batch's parameters with the insert and the
//! update built on it, the archive of overwritten rows, and the select lists the readers use
//! together with the positions they read at ([`Col`]). Adding a column is one line there (and its
//! migration); a test holds the list to the tables' columns, and one pushes, updates and reads
//! back a record whose every column differs from the others.

use std::sync::LazyLock;

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Utc};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{accepts, to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::CopyInSink;

use crate::db::DbResult;

/// A value of a `json` column, sent as its text: JSON text as it is (no `Value` to serialise on
/// the way), or a list of strings written out as a JSON array.
#[derive(Debug, Clone, Copy)]
pub enum JsonColumn<'a> {
    Text(&'a str),
    Strings(&'a [String]),
}

impl ToSql for JsonColumn<'_> {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // The binary form of `json` is its text.
        match self {
            JsonColumn::Text(text) => out.extend_from_slice(text.as_bytes()),
            JsonColumn::Strings(list) => serde_json::to_writer(out.writer(), list)?,
        }
        Ok(IsNull::No)
    }

    accepts!(JSON);
    to_sql_checked!();
}

/// Declares the columns: each one's name (as `records` has it), the Rust type a batch holds it
/// as, and its PostgreSQL type. Their order is that of every statement and of [`Col`]; readers
/// select a prefix of it, so the columns a record's state is made of come first.
macro_rules! record_columns {
    ($($name:ident: $ty:ty = $pg:ident,)*) => {
        /// A column of a record row; `as usize` is its position in [`Col::ALL`] and in every list
        /// [`select_through`] writes.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Col {
            $($name,)*
        }

        /// How many columns a record row has.
        pub const COLUMNS: usize = [$(stringify!($name),)*].len();

        impl Col {
            pub const ALL: [Col; COLUMNS] = [$(Col::$name,)*];

            /// Its name in `records`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Col::$name => stringify!($name),)*
                }
            }

            /// Its PostgreSQL type.
            pub fn pg_type(self) -> Type {
                match self {
                    $(Col::$name => Type::$pg,)*
                }
            }
        }

        /// One record row, its values borrowed from what is being written.
        pub struct Row<'a> {
            $(pub $name: $ty,)*
        }

        /// Record rows as columns, one array per column: what a set-based insert or update sends.
        pub struct Rows<'a> {
            $(pub $name: Vec<$ty>,)*
        }

        impl<'a> Rows<'a> {
            pub fn with_capacity(n: usize) -> Self {
                Rows { $($name: Vec::with_capacity(n),)* }
            }

            pub fn push(&mut self, row: Row<'a>) {
                $(self.$name.push(row.$name);)*
            }

            /// The rows at `indexes`, in order.
            pub fn select(&self, indexes: &[usize]) -> Self {
                let mut out = Self::with_capacity(indexes.len());
                for &i in indexes {
                    $(out.$name.push(self.$name[i]);)*
                }
                out
            }

            /// Every column as one array parameter, `$1..` of [`unnest`].
            pub fn params(&self) -> [&(dyn ToSql + Sync); COLUMNS] {
                [$(&self.$name,)*]
            }

            /// The values of row `i`, for a COPY.
            fn row(&self, i: usize) -> [&(dyn ToSql + Sync); COLUMNS] {
                [$(&self.$name[i],)*]
            }
        }
    };
}

record_columns! {
    // A record's state: what a pull page, a listing and `StoredRecord` hold.
    id: &'a str = TEXT,
    form_type: &'a str = TEXT,
    form_version: &'a str = TEXT,
    data: &'a str = TEXT,
    deleted: bool = BOOL,
    created_at: Option<DateTime<Utc>> = TIMESTAMPTZ,
    updated_at: Option<DateTime<Utc>> = TIMESTAMPTZ,
    synced_at: DateTime<Utc> = TIMESTAMPTZ,
    geolocation: Option<JsonColumn<'a>> = JSON,
    author: Option<&'a str> = TEXT,
    device_id: Option<&'a str> = TEXT,
    tags: Option<JsonColumn<'a>> = JSON,
    change_id: i64 = INT8,
    // The revision's provenance: what the history adds.
    client_id: &'a str = TEXT,
    transmission_id: Option<&'a str> = TEXT,
    pushed_by: &'a str = TEXT,
    overwrote_version: Option<i64> = INT8,
    conflict: bool = BOOL,
    // The record's owner, kept by `records` only.
    created_by: &'a str = TEXT,
}

impl Rows<'_> {
    pub fn len(&self) -> usize {
        self.id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.id.is_empty()
    }
}

/// The table a statement names its columns in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Records,
    Revisions,
}

impl Col {
    /// Its name in `table`; `None` where that table has no such column.
    pub const fn name_in(self, table: Table) -> Option<&'static str> {
        match (table, self) {
            (Table::Records, c) => Some(c.name()),
            (Table::Revisions, Col::id) => Some("record_id"),
            // Every revision of a record has the record's owner: the history does not repeat it.
            (Table::Revisions, Col::created_by) => None,
            (Table::Revisions, c) => Some(c.name()),
        }
    }

    /// Whether an update of a stored record writes it: not its key, and not its owner (a record
    /// keeps the owner of its first revision).
    const fn updated(self) -> bool {
        !matches!(self, Col::id | Col::created_by)
    }
}

/// The columns of a record's state (what `StoredRecord` holds): those up to `change_id`.
pub const STATE_COLUMNS: usize = Col::change_id as usize + 1;

/// The select list of the columns up to and including `last`, as `table` names them, each at its
/// position in [`Col::ALL`]. JSON columns are read as text and kept raw (see `StoredRecord`).
pub fn select_through(last: Col, table: Table) -> String {
    let names = Col::ALL[..=last as usize].iter().map(|&c| {
        let name = c.name_in(table).unwrap_or("NULL::text");
        if c.pg_type() == Type::JSON {
            format!("{name}::text")
        } else {
            name.to_string()
        }
    });
    names.collect::<Vec<_>>().join(", ")
}

fn names_in(table: Table) -> impl Iterator<Item = (Col, &'static str)> {
    Col::ALL.into_iter().filter_map(move |c| c.name_in(table).map(|name| (c, name)))
}

fn join(parts: impl Iterator<Item = String>) -> String {
    parts.collect::<Vec<_>>().join(", ")
}

/// A batch's columns as rows `u(...)`, each column under its name in `records`, from the
/// parameters of [`Rows::params`].
fn unnest() -> String {
    let arrays =
        join(Col::ALL.iter().enumerate().map(|(i, c)| format!("${}::{}[]", i + 1, c.pg_type().name())));
    let names = join(Col::ALL.iter().map(|c| c.name().to_string()));
    format!("unnest({arrays}) AS u({names})")
}

/// New current states, streamed in by binary COPY (see [`copy_rows`]).
pub static COPY_SQL: LazyLock<String> = LazyLock::new(|| {
    let names = join(Col::ALL.iter().map(|c| c.name().to_string()));
    format!("COPY records ({names}) FROM STDIN (FORMAT binary)")
});

/// A batch's rows as superseded revisions.
pub static INSERT_REVISIONS_SQL: LazyLock<String> = LazyLock::new(|| {
    let (columns, values): (Vec<_>, Vec<_>) =
        names_in(Table::Revisions).map(|(c, name)| (name.to_string(), format!("u.{}", c.name()))).unzip();
    format!(
        "INSERT INTO record_revisions ({}) SELECT {} FROM {}",
        columns.join(", "),
        values.join(", "),
        unnest()
    )
});

/// A batch's rows as the new current states of stored records. Each row is found by one index
/// probe and updated where that probe found it: sound because every writer that updates `records`
/// holds the change-log lock (a group written ahead only inserts new ids), so no row moves
/// between probe and update.
pub static UPDATE_SQL: LazyLock<String> = LazyLock::new(|| {
    let set = join(Col::ALL.iter().filter(|c| c.updated()).map(|c| format!("{0} = u.{0}", c.name())));
    format!(
        "UPDATE records SET {set}
         FROM {}
         CROSS JOIN LATERAL (SELECT ctid AS tid FROM records r WHERE r.id = u.id LIMIT 1) AS found
         WHERE records.ctid = found.tid",
        unnest()
    )
});

/// The current states of the records `$1` names, copied into the history inside the database.
pub static ARCHIVE_SQL: LazyLock<String> = LazyLock::new(|| {
    let (columns, values): (Vec<_>, Vec<_>) =
        names_in(Table::Revisions).map(|(c, name)| (name.to_string(), c.name().to_string())).unzip();
    format!(
        "INSERT INTO record_revisions ({}) SELECT {} FROM records WHERE id = ANY($1)",
        columns.join(", "),
        values.join(", ")
    )
});

/// Writes rows into a COPY started with [`COPY_SQL`], a batch of them at a time.
#[tracing::instrument(name = "db.record_row.copy_rows", level = "debug", skip_all)]
pub async fn copy_rows<'a>(
    sink: CopyInSink<bytes::Bytes>,
    batches: impl Iterator<Item = Rows<'a>>,
) -> DbResult<()> {
    let types = Col::ALL.map(Col::pg_type);
    let writer = BinaryCopyInWriter::new(sink, &types);
    let mut writer = std::pin::pin!(writer);
    for rows in batches {
        for i in 0..rows.len() {
            writer.as_mut().write(&rows.row(i)).await?;
        }
    }
    writer.finish().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_names_the_columns_in_one_order() {
        let all: Vec<&str> = Col::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            COPY_SQL.as_str(),
            format!("COPY records ({}) FROM STDIN (FORMAT binary)", all.join(", "))
        );
        assert!(UPDATE_SQL.contains(&format!("AS u({})", all.join(", "))));
        assert!(UPDATE_SQL.contains("form_type = u.form_type, form_version = u.form_version"));
        assert!(!UPDATE_SQL.contains("created_by = ") && !UPDATE_SQL.contains(" id = u.id,"));
        let revisions =
            "record_id, form_type, form_version, data, deleted, created_at, updated_at, synced_at, \
             geolocation, author, device_id, tags, change_id, client_id, transmission_id, pushed_by, \
             overwrote_version, conflict";
        assert!(INSERT_REVISIONS_SQL
            .starts_with(&format!("INSERT INTO record_revisions ({revisions}) SELECT u.id, u.form_type")));
        assert!(ARCHIVE_SQL
            .starts_with(&format!("INSERT INTO record_revisions ({revisions}) SELECT id, form_type")));
        assert_eq!(
            select_through(Col::change_id, Table::Records),
            "id, form_type, form_version, data, deleted, created_at, updated_at, synced_at, \
             geolocation::text, author, device_id, tags::text, change_id"
        );
        assert!(select_through(Col::conflict, Table::Revisions).starts_with("record_id, form_type"));
        assert_eq!(STATE_COLUMNS, 13);
    }

    #[test]
    fn a_json_column_is_its_text() {
        let mut out = BytesMut::new();
        let tags = ["a\"b".to_string(), "c".to_string()];
        JsonColumn::Strings(&tags).to_sql(&Type::JSON, &mut out).unwrap();
        assert_eq!(&out[..], br#"["a\"b","c"]"#);
        out.clear();
        JsonColumn::Text(r#"{"lat":1.50}"#).to_sql(&Type::JSON, &mut out).unwrap();
        assert_eq!(&out[..], br#"{"lat":1.50}"#);
    }
}
