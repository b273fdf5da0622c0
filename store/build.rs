//! The store's build step:
//! - generates every view of the hot row from its one definition,
//!   `hot_row.toml` (see `build/hot_row.rs`);
//! - rebuilds the crate when a migration is added or changed:
//!   `sqlx::migrate!` embeds `migrations/` at compile time, and cargo does
//!   not watch it otherwise.

#[path = "build/hot_row.rs"]
mod hot_row;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=hot_row.toml");
    println!("cargo:rerun-if-changed=build/hot_row.rs");
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let toml = std::fs::read_to_string("hot_row.toml").expect("store/hot_row.toml");
    if let Err(e) = hot_row::generate(&toml, &out_dir) {
        panic!("{e}");
    }
}
