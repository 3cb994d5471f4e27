//! Device selection (`--device cpu|N`).
