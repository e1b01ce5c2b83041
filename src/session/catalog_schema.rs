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
//! A private table is opened again after the data owner verified its files again
//! ([`crate::policy::verified_files`]): its schema is read from the files its scans may read.

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
use tokio::sync::Mutex;

use crate::policy::{Catalog, PrivateTable, TableInfo, VerifiedFile};

/// One table of the catalog: where its files are, whether it is private, and its provider once a
/// statement named it, with the verification of its files it was opened under (None for a public
/// table, or a private one never verified).
#[derive(Debug)]
struct Table {
    name: String,
    location: String,
    private: bool,
    opened: Mutex<Option<Opened>>,
}

/// A table's provider and the verification of its files it was opened under.
type Opened = (Option<Vec<VerifiedFile>>, Arc<dyn TableProvider>);

/// The catalog's tables as a schema whose tables open on first use (module docs).
///
/// A statement's name resolves as in PostgreSQL, with one convenience: an unquoted name folds
/// to lower case and a quoted one keeps its case; a table whose catalog name is exactly that is
/// the one named, and otherwise the one table whose name folds to it (`Sales` reaches a table
/// registered as `Sales`). Catalogs refuse names that differ only in case; in one written before
/// they did, `p` and `"P"` reach `p` and `P`, and a name that folds to several tables and is
/// none of them is refused, naming them.
#[derive(Debug)]
pub(super) struct CatalogSchema {
    /// By their names in the catalog.
    tables: BTreeMap<String, Table>,
    /// The catalog's names by the name an unquoted reference to them resolves to (lower case).
    folded: BTreeMap<String, Vec<String>>,
    /// The catalog, which private tables consult at every scan (their verified files).
    catalog: Arc<Catalog>,
    /// The session's configuration and runtime, from which the state that reads a table's
    /// footers is built (not the session's own state, which holds this schema).
    config: SessionConfig,
    runtime: Arc<RuntimeEnv>,
}

impl CatalogSchema {
    /// The schema of `catalog`'s `tables`, read (when a statement names one) with the session's
    /// `config` and `runtime`.
    pub(super) fn new(
        catalog: Arc<Catalog>,
        tables: Vec<TableInfo>,
        config: SessionConfig,
        runtime: Arc<RuntimeEnv>,
    ) -> Self {
        let mut folded: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let tables = tables
            .into_iter()
            .map(|t| {
                // The name a statement's unquoted reference resolves to, as
                // `SessionContext::register_table` keys a table registered by name.
                folded
                    .entry(TableReference::from(t.name.as_str()).table().to_string())
                    .or_default()
                    .push(t.name.clone());
                let table =
                    Table { name: t.name, location: t.location, private: t.policy.is_some(), opened: Mutex::new(None) };
                (table.name.clone(), table)
            })
            .collect();
        Self { tables, folded, catalog, config, runtime }
    }

    /// The table a statement's (normalised) `name` names (the type's docs); an error if it folds
    /// to several tables and is none of them.
    fn resolve(&self, name: &str) -> Result<Option<&Table>> {
        if let Some(t) = self.tables.get(name) {
            return Ok(Some(t));
        }
        match self.folded.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([one]) => Ok(self.tables.get(one)),
            Some(several) => {
                let quoted: Vec<String> = several.iter().map(|n| format!("\"{n}\"")).collect();
                Err(DataFusionError::Plan(format!(
                    "table name '{name}' folds to the names of {} catalog tables: quote the one meant ({})",
                    quoted.len(),
                    quoted.join(", ")
                )))
            }
        }
    }

    /// The names a listing shows: as a statement writes them, folded where that reaches the table.
    fn listed_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .folded
            .iter()
            .flat_map(|(f, exact)| match exact.as_slice() {
                [one] if !self.tables.contains_key(f) || f == one => vec![f.clone()],
                _ => exact.clone(),
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// `t`'s provider, its schema read from its files; a private table's scans read the files of
    /// the verification `verified` only.
    async fn open(&self, t: &Table, verified: Option<Vec<VerifiedFile>>) -> Result<Arc<dyn TableProvider>> {
        let state = SessionStateBuilder::new()
            .with_config(self.config.clone())
            .with_runtime_env(Arc::clone(&self.runtime))
            .build();
        let inner = parquet_provider(&state, &t.location)
            .await
            .map_err(|e| DataFusionError::Plan(format!("table '{}' ({}) cannot be opened: {e}", t.name, t.location)))?;
        Ok(if t.private {
            Arc::new(PrivateTable::new(&t.name, inner, Arc::clone(&self.catalog), verified))
        } else {
            inner
        })
    }
}

#[async_trait]
impl SchemaProvider for CatalogSchema {
    fn table_names(&self) -> Vec<String> {
        self.listed_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some(t) = self.resolve(name)? else { return Ok(None) };
        // A private table is opened again once its files were verified again, so that its schema
        // is that of the files its scans may read (a column's type may have changed with them).
        let verified = match t.private {
            true => self.catalog.verified_files(&t.name).map_err(|e| DataFusionError::Plan(e.to_string()))?,
            false => None,
        };
        let mut opened = t.opened.lock().await;
        if let Some((under, provider)) = opened.as_ref()
            && *under == verified
        {
            return Ok(Some(Arc::clone(provider)));
        }
        let provider = self.open(t, verified.clone()).await?;
        *opened = Some((verified, Arc::clone(&provider)));
        Ok(Some(provider))
    }

    /// Every table of the catalog is a base table: listing them (`information_schema.tables`,
    /// `SHOW TABLES`) opens none.
    async fn table_type(&self, name: &str) -> Result<Option<TableType>> {
        Ok(self.resolve(name)?.map(|_| TableType::Base))
    }

    fn table_exist(&self, name: &str) -> bool {
        !matches!(self.resolve(name), Ok(None))
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
