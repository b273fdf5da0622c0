//! The cold tier's object store: Parquet archives under
//! `<prefix>dt=YYYY-MM-DD/part-NNNN.parquet`, on S3 (or any S3-compatible
//! server) or a local directory. Object names are a function of the day
//! and the part number only, so a re-run overwrites instead of adding.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, RetryConfig};

use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use crate::config::{ColdConfig, ColdLocation};
use crate::error::StoreError;
use crate::Day;

/// The archive: an object store and the prefix inferlog owns in it.
#[derive(Debug, Clone)]
pub struct ColdStore {
    store: Arc<dyn ObjectStore>,
    /// Inside `store`; empty or ending without a slash (object_store paths).
    prefix: String,
    /// For logs and reports: the configured URL.
    pub url: String,
}

/// One archived object as listed from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdObject {
    pub key: String,
    /// The day of its `dt=` folder; `None` for an object inferlog did not name.
    pub day: Option<Day>,
    pub bytes: u64,
}

impl ColdStore {
    pub fn new(config: &ColdConfig) -> Result<ColdStore, StoreError> {
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match ColdLocation::parse(&config.url)? {
            ColdLocation::S3 { bucket, prefix } => {
                // Bounded retries: an unreachable store fails the pass in
                // seconds (reported, retried on the next pass) rather than
                // hanging it for object_store's default of minutes.
                let retry = RetryConfig {
                    backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(2), base: 2.0 },
                    max_retries: 4,
                    retry_timeout: Duration::from_secs(20),
                };
                // One ClientOptions carries allow_http too: the builder's
                // with_client_options replaces whatever was set before.
                let client = ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120))
                    .with_allow_http(config.allow_http);
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_region(&config.region)
                    .with_retry(retry)
                    .with_unsigned_payload(!config.sign_payload)
                    .with_client_options(client);
                if !config.endpoint.is_empty() {
                    builder = builder.with_endpoint(&config.endpoint);
                }
                if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
                    if let Some(id) = &config.access_key_id {
                        builder = builder.with_access_key_id(id);
                    }
                }
                if let Some(secret) = config.secret_access_key()? {
                    builder = builder.with_secret_access_key(secret);
                }
                let store = builder.build().map_err(StoreError::object("configure", &config.url))?;
                (Arc::new(store), prefix)
            }
            ColdLocation::Local { dir } => {
                std::fs::create_dir_all(&dir).map_err(|e| StoreError::Config(format!("cold.url: cannot create {}: {e}", dir.display())))?;
                let store = LocalFileSystem::new_with_prefix(&dir).map_err(StoreError::object("configure", &config.url))?;
                (Arc::new(store.with_automatic_cleanup(true)), String::new())
            }
        };
        Ok(ColdStore { store, prefix, url: config.url.clone() })
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    fn join(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    /// The folder of one day: `<prefix>/dt=YYYY-MM-DD`.
    pub fn day_dir(&self, day: Day) -> String {
        self.join(&format!("dt={}", crate::day_string(day)))
    }

    /// The key of part `part` of `day`.
    pub fn object_key(&self, day: Day, part: u32) -> String {
        format!("{}/part-{part:04}.parquet", self.day_dir(day))
    }

    /// The key of part `part` of unit `unit` of `day` (a day archived in units).
    pub fn unit_object_key(&self, day: Day, unit: &crate::model::unit::Unit, part: u32) -> String {
        format!("{}/unit-{:04}-of-{:04}-part-{part:04}.parquet", self.day_dir(day), unit.index, unit.of)
    }

    /// The key of part `part` of a supplement of `day` (rows archived after
    /// the day was released), named by `tag`.
    pub fn supplement_key(&self, day: Day, tag: &str, part: u32) -> String {
        format!("{}/late-{tag}-{part:04}.parquet", self.day_dir(day))
    }

    /// The day a key belongs to, from its `dt=` folder.
    pub fn day_of_key(&self, key: &str) -> Option<Day> {
        let rest = if self.prefix.is_empty() { key } else { key.strip_prefix(&self.prefix)?.strip_prefix('/')? };
        let folder = rest.strip_prefix("dt=")?;
        crate::parse_day(folder.get(..10)?).filter(|_| folder.as_bytes().get(10) == Some(&b'/'))
    }

    /// A 0-byte "folder" key (`<prefix>/` or `<prefix>/dt=YYYY-MM-DD/`, which
    /// the listing shows without its trailing slash): S3 consoles, pyarrow
    /// and other tools leave them when they create a folder or delete the
    /// last object in one. Not data: no tier counts or deletes them.
    fn is_folder_marker(&self, meta: &ObjectMeta) -> bool {
        let key = meta.location.as_ref();
        let rest = if self.prefix.is_empty() { Some(key) } else { key.strip_prefix(&self.prefix).map(|r| r.strip_prefix('/').unwrap_or(r)) };
        meta.size == 0 && rest.is_some_and(|r| r.is_empty() || r.strip_prefix("dt=").and_then(crate::parse_day).is_some())
    }

    fn describe(&self, meta: ObjectMeta) -> ColdObject {
        let key = meta.location.to_string();
        ColdObject { day: self.day_of_key(&key), key, bytes: meta.size }
    }

    /// The objects of one day.
    pub async fn list_day(&self, day: Day) -> Result<Vec<ColdObject>, StoreError> {
        let dir = Path::from(self.day_dir(day));
        let metas: Vec<ObjectMeta> = self.store.list(Some(&dir)).try_collect().await.map_err(StoreError::object("list", &dir))?;
        let mut objects: Vec<ColdObject> = metas.into_iter().filter(|m| !self.is_folder_marker(m)).map(|m| self.describe(m)).collect();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// Every object under the prefix (for audits: orphans and missing objects).
    pub async fn list_all(&self) -> Result<Vec<ColdObject>, StoreError> {
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        let metas: Vec<ObjectMeta> = self.store.list(prefix.as_ref()).try_collect().await.map_err(StoreError::object("list", &self.url))?;
        let mut objects: Vec<ColdObject> = metas.into_iter().filter(|m| !self.is_folder_marker(m)).map(|m| self.describe(m)).collect();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// Deletes one object; deleting one that is gone succeeds.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::object("delete", key)(e)),
        }
    }
}

/// Ranged reads of one object of known size, for the Parquet reader.
#[derive(Debug)]
pub struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
}

fn external(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl ObjectReader {
    /// The object's key.
    pub fn key(&self) -> String {
        self.path.to_string()
    }
}

impl ColdStore {
    /// Ranged reads of the object `key` of `size` bytes (the manifest's),
    /// for a Parquet reader that fetches only the row groups it decodes.
    pub fn reader(&self, key: &str, size: u64) -> ObjectReader {
        ObjectReader { store: self.store.clone(), path: Path::from(key), size }
    }
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        Box::pin(async move { self.store.get_range(&self.path, range).await.map_err(external) })
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move { self.store.get_ranges(&self.path, &ranges).await.map_err(external) })
    }

    fn get_metadata<'a>(&'a mut self, _options: Option<&'a ArrowReaderOptions>) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            Ok(Arc::new(ParquetMetaDataReader::new().load_and_finish(self, size).await?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_keys() {
        assert_eq!(
            ColdLocation::parse("s3://inferlog-cold/archive/v1/").expect("s3"),
            ColdLocation::S3 { bucket: "inferlog-cold".into(), prefix: "archive/v1".into() }
        );
        assert!(matches!(ColdLocation::parse("file:///tmp/x/").expect("file"), ColdLocation::Local { .. }));
        assert!(ColdLocation::parse("s3:///nobucket").is_err());
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("file://{}/", dir.path().display());
        let store = ColdStore::new(&ColdConfig { url, ..ColdConfig::default() }).expect("local store");
        let day = crate::parse_day("2026-11-20").expect("day");
        assert_eq!(store.object_key(day, 3), "dt=2026-11-20/part-0003.parquet");
        assert_eq!(store.day_of_key("dt=2026-11-20/part-0003.parquet"), Some(day));
        assert_eq!(store.day_of_key("dt=2026-11-20x/part-0003.parquet"), None);
        assert_eq!(store.day_of_key("other/file"), None);
        let meta =
            |key: &str, size: u64| ObjectMeta { location: Path::from(key), last_modified: chrono::Utc::now(), size, e_tag: None, version: None };
        assert!(store.is_folder_marker(&meta("dt=2026-11-20", 0)), "a day folder");
        assert!(!store.is_folder_marker(&meta("dt=2026-11-20", 10)), "bytes are data");
        assert!(!store.is_folder_marker(&meta("dt=2026-11-20/part-0000.parquet", 0)), "an empty object is an object");
    }
}
