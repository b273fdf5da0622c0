//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds `migrations/` at compile time, and cargo does not watch it otherwise.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
