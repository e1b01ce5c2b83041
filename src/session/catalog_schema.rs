//! The default schema of a catalog session: the catalog's tables, each opened — its files
//! listed and their footers read for its schema — the first time a statement names it, not when
//! the session opens; and [`parquet_provider`], which opens a Parquet location as a table (here
//! and for the data owner's checks).
//!
//! Opening every table as the session opens would make a one-query `dpcurve sql --catalog … -c`
//! process pay one footer read per table of the catalog whatever it asks, and one table whose
//! files cannot be read would keep every other table from being queried. The names, locations
//! and privacy of the tables are read from the catalog when the session opens (with the
//! locations' checks); only the Parquet side waits. A table that cannot be opened fails the
//! statements that name it, at planning (before any charge), and is tried again by the next one.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::context::SessionConfig;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::TableType;
use datafusion::prelude::ParquetReadOptions;
use tokio::sync::OnceCell;

use crate::policy::{PrivateTable, TableInfo};

/// One table of the catalog: where its files are, whether it is private, and its provider once a
/// statement named it.
#[derive(Debug)]
struct Table {
    name: String,
    location: String,
    private: bool,
    opened: OnceCell<Arc<dyn TableProvider>>,
}

/// The catalog's tables as a schema whose tables open on first use (module docs).
#[derive(Debug)]
pub(super) struct CatalogSchema {
    /// By the name a statement resolves (SQL's normalisation of the catalog's name).
    tables: BTreeMap<String, Table>,
    /// The session's configuration and runtime, from which the state that reads a table's
    /// footers is built (not the session's own state, which holds this schema).
    config: SessionConfig,
    runtime: Arc<RuntimeEnv>,
}

impl CatalogSchema {
    /// The schema of `tables`, read (when a statement names one) with the session's `config` and
    /// `runtime`.
    pub(super) fn new(tables: Vec<TableInfo>, config: SessionConfig, runtime: Arc<RuntimeEnv>) -> Self {
        let tables = tables
            .into_iter()
            .map(|t| {
                // The name a statement's reference to it resolves to (unquoted names fold to lower
                // case), as `SessionContext::register_table` keys a table registered by name.
                let key = TableReference::from(t.name.as_str()).table().to_string();
                let table =
                    Table { name: t.name, location: t.location, private: t.policy.is_some(), opened: OnceCell::new() };
                (key, table)
            })
            .collect();
        Self { tables, config, runtime }
    }

    async fn open(&self, t: &Table) -> Result<Arc<dyn TableProvider>> {
        let state = SessionStateBuilder::new()
            .with_config(self.config.clone())
            .with_runtime_env(Arc::clone(&self.runtime))
            .build();
        let inner = parquet_provider(&state, &t.location)
            .await
            .map_err(|e| DataFusionError::Plan(format!("table '{}' ({}) cannot be opened: {e}", t.name, t.location)))?;
        Ok(if t.private { Arc::new(PrivateTable::new(&t.name, inner)) } else { inner })
    }
}

#[async_trait]
impl SchemaProvider for CatalogSchema {
    fn table_names(&self) -> Vec<String> {
        self.tables.keys().cloned().collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some(t) = self.tables.get(name) else { return Ok(None) };
        Ok(Some(Arc::clone(t.opened.get_or_try_init(|| self.open(t)).await?)))
    }

    /// Every table of the catalog is a base table: listing them (`information_schema.tables`,
    /// `SHOW TABLES`) opens none.
    async fn table_type(&self, name: &str) -> Result<Option<TableType>> {
        Ok(self.tables.contains_key(name).then_some(TableType::Base))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.tables.contains_key(name)
    }
}

/// The table of the Parquet file or directory at `location`, its schema read from the footers with `state`.
pub(super) async fn parquet_provider(state: &SessionState, location: &str) -> Result<Arc<dyn TableProvider>> {
    let url = ListingTableUrl::parse(location)?;
    let options =
        ParquetReadOptions::default().to_listing_options(state.config(), state.default_table_options().clone());
    let config = ListingTableConfig::new(url).with_listing_options(options).infer_schema(state).await?;
    Ok(Arc::new(ListingTable::try_new(config)?))
}
