//! Device selection: `auto | cpu | cuda[:N]`.
