//! OTLP spans as events, for topics encoded as `otlp_proto` or
//! `otlp_json` (`kafka.encodings`). In: a message's payload. Out: its
//! spans ([`decode`]) and, for each inference span, the event it stands
//! for ([`map`]), which the normalizing stage validates like any other.

pub mod decode;
pub mod json;
mod json_flat;
pub mod map;
#[cfg(test)]
mod strategies;
pub mod view;
pub mod wire;

pub use decode::{decode, spans, ResourceSpan};
pub use map::{Mapped, MappedEvent, Mapper};
