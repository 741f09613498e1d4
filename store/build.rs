// `sqlx::migrate!` embeds the migration files at compile time; without this, adding a
// migration would not rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    println!("cargo:rerun-if-changed=../migrations_sqlite");
}
