//! The Kafka connection every component shares: the `[kafka]` table (the
//! source topics and the DLQ, which is a tier of its own), how clients
//! authenticate (`[kafka.security]`, the password from the environment or
//! a file), and the librdkafka properties built from them
//! ([`client_properties`]). Ingest consumes and produces with them;
//! retention asks the broker about the DLQ. This crate does not link
//! librdkafka: the crates that talk to Kafka collect the properties into
//! rdkafka's `ClientConfig` themselves.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::StoreError;

/// How a replica gets its partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Assignment {
    Group,
    Static,
}

/// What the DLQ keeps of a rejected message's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DlqPayload {
    /// No plaintext personal data: a JSON object has its `user_id` replaced
    /// by its keyed hash (the stored form), string values the PII detector
    /// flags masked and prompt or completion fields removed; other bytes
    /// have e-mail addresses and phone numbers masked. Headers carry the
    /// original's size and SHA-256.
    Redacted,
    /// The original bytes, as received (the DLQ then holds plaintext
    /// personal data, and the retention audit says so).
    Original,
}

/// How a source topic's messages are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TopicEncoding {
    /// One JSON event per message (docs/contract.md §1).
    Json,
    /// OTLP traces as the OpenTelemetry Collector's Kafka exporter writes
    /// them with `encoding: otlp_proto`: each inference span becomes an
    /// event (`[otlp]`, docs/contract.md "OTLP spans").
    OtlpProto,
    /// The same with `encoding: otlp_json` (OTLP/JSON).
    OtlpJson,
}

impl TopicEncoding {
    /// Whether a message holds OTLP spans (many events) rather than one event.
    pub fn is_otlp(self) -> bool {
        self != TopicEncoding::Json
    }
}

/// The `[kafka]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers. Default: "127.0.0.1:9092".
    pub brokers: String,
    /// Topics to consume. Default: ["inference-events"].
    pub topics: Vec<String>,
    /// How each topic's messages are encoded, by topic name: "json" (one
    /// event per message), "otlp_proto" or "otlp_json" (OTLP traces from
    /// the OpenTelemetry Collector's Kafka exporter, one event per
    /// inference span). A topic not listed is "json". Default: {}.
    pub encodings: BTreeMap<String, TopicEncoding>,
    /// Consumer group; replicas with the same group share the partitions. Default: "inferlog-ingest".
    pub group_id: String,
    /// How partitions are shared between replicas: "group" (the consumer
    /// group assigns them and rebalances when replicas come and go) or
    /// "static" (this replica reads `partitions`, or every partition, with
    /// offsets still committed under `group_id`; for brokers whose group
    /// coordinator cannot be trusted to expire a crashed member). Default: "group".
    pub assignment: Assignment,
    /// With `assignment = "group"`: librdkafka's `partition.assignment.strategy`.
    /// "cooperative-sticky" moves only the partitions that change owner
    /// (the others keep being read through a rebalance); "range" or
    /// "roundrobin" stop the whole group at every rebalance. Every member
    /// of a group must use the same: switching a running group from an
    /// eager assignor to "cooperative-sticky" takes a full stop of its
    /// members. Default: "cooperative-sticky".
    pub assignor: String,
    /// With `assignment = "static"`: the partitions this replica reads; empty means all. Default: [].
    pub partitions: Vec<i32>,
    /// Dead-letter topic for rejected messages. Default: "inference-events-dlq".
    pub dlq_topic: String,
    /// What the DLQ keeps of a rejected message: "redacted" (no plaintext
    /// user id, e-mail address, phone number or prompt text; no payload at
    /// all for a message the contract could not read as an event; the
    /// producer's key as its keyed hash; the original's size and SHA-256
    /// in headers) or "original" (the bytes and key as received: plaintext
    /// personal data in the DLQ, which the audit reports). Default: "redacted".
    pub dlq_payload: DlqPayload,
    /// Producer headers a DLQ message carries, by name (as
    /// `inferlog.header.<name>`; under "redacted" with e-mail addresses and
    /// phone numbers masked). No other producer header is ever copied.
    /// Default: [] (none).
    pub dlq_headers: Vec<String>,
    /// How long the group waits for a silent member before reassigning its partitions. Default: "10s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub session_timeout: Duration,
    /// Longest a fetch waits at the broker for more data (librdkafka
    /// `fetch.wait.max.ms`). Short, because some Kafka-compatible brokers
    /// always wait the full time. Default: "20ms".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub fetch_max_wait: Duration,
    /// Upper bound of messages librdkafka prefetches, in KiB; bounds memory when ClickHouse is slow. Default: 8192.
    pub prefetch_max_kbytes: u32,
    /// How consumer, DLQ producer and admin client connect and authenticate
    /// (protocol, sasl_mechanism, username, password_file, ca_file; the
    /// password itself from INFERLOG_KAFKA_PASSWORD or password_file).
    /// Default: plaintext, no SASL, the system's CAs.
    pub security: KafkaSecurity,
    /// Extra librdkafka properties for consumer and producer (secrets are
    /// refused here: they belong in `security`). Default: none.
    pub options: BTreeMap<String, String>,
}

/// The protocol of the broker listener inferlog connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn librdkafka(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "plaintext",
            SecurityProtocol::Ssl => "ssl",
            SecurityProtocol::SaslPlaintext => "sasl_plaintext",
            SecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }

    fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

/// Environment variable holding the SASL password (wins over `password_file`).
pub const KAFKA_PASSWORD_ENV: &str = "INFERLOG_KAFKA_PASSWORD";

/// The `[kafka.security]` table. The password is never a value of this
/// file: it comes from `INFERLOG_KAFKA_PASSWORD` or `password_file`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSecurity {
    /// "plaintext", "ssl", "sasl_plaintext" or "sasl_ssl". Default: "plaintext".
    pub protocol: SecurityProtocol,
    /// SASL mechanism: "SCRAM-SHA-512", "SCRAM-SHA-256" or "PLAIN". Default: "SCRAM-SHA-512".
    pub sasl_mechanism: String,
    /// SASL user name. Default: "".
    pub username: String,
    /// File whose content (trimmed) is the SASL password, when `INFERLOG_KAFKA_PASSWORD` is unset. Default: "".
    pub password_file: String,
    /// PEM file of the CA that signed the brokers' certificates; empty means the system's CAs. Default: "".
    pub ca_file: String,
}

impl Default for KafkaSecurity {
    fn default() -> Self {
        KafkaSecurity {
            protocol: SecurityProtocol::Plaintext,
            sasl_mechanism: "SCRAM-SHA-512".into(),
            username: String::new(),
            password_file: String::new(),
            ca_file: String::new(),
        }
    }
}

/// A secret read at start-up: never printed, whatever prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The librdkafka properties of `[kafka.security]`, password resolved.
/// `Debug` shows the password as `<redacted>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSecurity {
    pub properties: Vec<(&'static str, String)>,
    pub password: Option<Secret>,
}

/// librdkafka properties that hold secrets: refused in `kafka.options`.
pub const SECRET_OPTIONS: [&str; 4] = ["sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret"];

impl KafkaSecurity {
    /// Checks the table and reads the password (environment first, then the file).
    pub fn resolve(&self) -> Result<ClientSecurity, StoreError> {
        let bad = |why: String| StoreError::Config(format!("kafka.security: {why}"));
        let mut properties = vec![("security.protocol", self.protocol.librdkafka().to_owned())];
        if self.protocol.tls() && !self.ca_file.is_empty() {
            if !Path::new(&self.ca_file).is_file() {
                return Err(bad(format!("ca_file {:?} is not a readable file", self.ca_file)));
            }
            properties.push(("ssl.ca.location", self.ca_file.clone()));
        }
        if !self.protocol.sasl() {
            return Ok(ClientSecurity { properties, password: None });
        }
        if !["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"].contains(&self.sasl_mechanism.as_str()) {
            return Err(bad(format!("sasl_mechanism {:?}: one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN", self.sasl_mechanism)));
        }
        if self.username.is_empty() {
            return Err(bad("username must be set for a SASL protocol".into()));
        }
        let password = match std::env::var(KAFKA_PASSWORD_ENV) {
            Ok(p) if !p.is_empty() => p,
            _ if self.password_file.is_empty() => {
                return Err(bad(format!("a SASL protocol needs a password: set {KAFKA_PASSWORD_ENV} or password_file")));
            }
            _ => std::fs::read_to_string(&self.password_file)
                .map_err(|e| bad(format!("password_file {:?}: {e}", self.password_file)))?
                .trim()
                .to_owned(),
        };
        if password.is_empty() {
            return Err(bad(format!("password_file {:?} is empty", self.password_file)));
        }
        properties.push(("sasl.mechanism", self.sasl_mechanism.clone()));
        properties.push(("sasl.username", self.username.clone()));
        Ok(ClientSecurity { properties, password: Some(Secret(password)) })
    }

    /// "SASL_SSL SCRAM-SHA-512" or "PLAINTEXT": for error messages.
    pub fn describe(&self) -> String {
        let protocol = self.protocol.librdkafka().to_ascii_uppercase();
        if self.protocol.sasl() {
            format!("{protocol} {}", self.sasl_mechanism)
        } else {
            protocol
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            topics: vec!["inference-events".into()],
            encodings: BTreeMap::new(),
            group_id: "inferlog-ingest".into(),
            assignment: Assignment::Group,
            assignor: "cooperative-sticky".into(),
            partitions: Vec::new(),
            dlq_topic: "inference-events-dlq".into(),
            dlq_payload: DlqPayload::Redacted,
            dlq_headers: Vec::new(),
            session_timeout: Duration::from_secs(10),
            fetch_max_wait: Duration::from_millis(20),
            prefetch_max_kbytes: 8 * 1024,
            security: KafkaSecurity::default(),
            options: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// `session.timeout.ms` for every consumer inferlog makes (ingest's, the
    /// DLQ readers, retention's): the configured `session_timeout`, so a
    /// `max.poll.interval.ms` in `options` below librdkafka's own default
    /// (45 s) is never refused at client creation.
    pub fn session_timeout_ms(&self) -> String {
        self.session_timeout.as_millis().to_string()
    }

    /// How `topic`'s messages are encoded.
    pub fn encoding(&self, topic: &str) -> TopicEncoding {
        self.encodings.get(topic).copied().unwrap_or(TopicEncoding::Json)
    }
}

/// librdkafka properties, in the order they apply (a later one replaces
/// an earlier one of the same name). `collect()` them into rdkafka's
/// `ClientConfig`. Their `Debug` names the keys only: one holds the password.
pub struct ClientProperties(Vec<(String, String)>);

impl std::fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(k, _)| k)).finish()
    }
}

impl IntoIterator for ClientProperties {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// The librdkafka properties shared by the consumer, the DLQ producer and
/// retention's clients: brokers, `[kafka.security]` (password read here)
/// and `kafka.options`. Never log their values: one holds the password.
pub fn client_properties(kafka: &KafkaConfig) -> Result<ClientProperties, StoreError> {
    let security = kafka.security.resolve()?;
    let mut properties = vec![("bootstrap.servers".to_owned(), kafka.brokers.clone())];
    properties.extend(security.properties.into_iter().map(|(k, v)| (k.to_owned(), v)));
    if let Some(password) = &security.password {
        properties.push(("sasl.password".to_owned(), password.expose().to_owned()));
    }
    properties.extend(kafka.options.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(ClientProperties(properties))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_apply_in_order_and_their_debug_shows_no_value() {
        let kafka = KafkaConfig {
            brokers: "b:9092".into(),
            options: BTreeMap::from([("sasl.password".to_owned(), "hunter2".to_owned()), ("bootstrap.servers".to_owned(), "c:9092".to_owned())]),
            ..KafkaConfig::default()
        };
        let properties = client_properties(&kafka).expect("properties");
        let debug = format!("{properties:?}");
        assert!(debug.contains("sasl.password") && !debug.contains("hunter2"), "{debug}");
        let all: Vec<(String, String)> = properties.into_iter().collect();
        assert_eq!(all.first(), Some(&("bootstrap.servers".to_owned(), "b:9092".to_owned())));
        assert_eq!(
            all[all.len() - 2..],
            [("bootstrap.servers".to_owned(), "c:9092".to_owned()), ("sasl.password".to_owned(), "hunter2".to_owned())],
            "options last: they win"
        );
    }
}
