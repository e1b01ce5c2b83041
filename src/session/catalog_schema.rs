//! The default schema of a catalog session: the catalog's tables, each opened — its files
//! listed and their footers read for its schema — the first time a statement names it, not when
//! the session opens.
//!
//! A session used to open every table of its catalog before its first statement: a one-query
//! `dpcurve sql --catalog … -c` process paid one footer read per table of the catalog whatever it
//! asked, and one table whose files could not be read kept every other table from being
//! queried. The names, locations and privacy of the tables are read from the catalog when the
//! session opens (as before, with the locations' checks); only the Parquet side waits. A table
//! that cannot be opened fails the statements that name it, at planning (before any charge),
//! with the same message, and is tried again by the next one.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::execution::context::SessionConfig;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionStateBuilder;
use tokio::sync::OnceCell;

use super::parquet_provider;
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
                // The name a statement's reference to it resolves to, as when the table was
                // registered in a session by name.
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

    fn table_exist(&self, name: &str) -> bool {
        self.tables.contains_key(name)
    }
}
