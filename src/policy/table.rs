//! Table providers of catalog sessions: [`PrivateTable`], the marker wrapper by which the
//! guard recognises private data (by type, never by name), and [`BudgetsTable`], the
//! `dpcurve.budgets` view of remaining budgets that analysts may read.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{ScanArgs, ScanResult, Session, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;

use super::catalog::Catalog;
use super::verified_files::{VerifiedFile, check_scan};

/// A private table: scans delegate to the Parquet provider, but the type marks the rows as
/// private for the planner guard. It reports no statistics. It was opened (its schema read) under
/// one verification of the table's files; a scan is refused unless that verification is still
/// the catalog's and the scan reads its files only, unchanged ([`check_scan`]).
#[derive(Debug)]
pub struct PrivateTable {
    name: String,
    inner: Arc<dyn TableProvider>,
    catalog: Arc<Catalog>,
    verified: Option<Vec<VerifiedFile>>,
}

impl PrivateTable {
    /// Wraps `inner`, opened when the files of the private table `name` of `catalog` were
    /// verified as `verified` records (None: never).
    pub fn new(
        name: &str,
        inner: Arc<dyn TableProvider>,
        catalog: Arc<Catalog>,
        verified: Option<Vec<VerifiedFile>>,
    ) -> Self {
        Self { name: name.to_string(), inner, catalog, verified }
    }

    /// The catalog name, which keys the table's budget.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Refuses `plan`, a scan of this table, unless it reads verified files only, unchanged.
    fn check(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
        let now = self.catalog.verified_files(&self.name).map_err(|e| DataFusionError::Plan(e.to_string()))?;
        if now != self.verified {
            return Err(DataFusionError::Plan(format!(
                "[rule verified-files] private table '{}': its files were verified again while this statement \
                 was planned; run it again",
                self.name
            )));
        }
        check_scan(&self.name, now.as_deref(), plan)
    }
}

#[async_trait]
impl TableProvider for PrivateTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.scan(state, projection, filters, limit).await?;
        self.check(&plan)?;
        Ok(plan)
    }

    async fn scan_with_args<'a>(&self, state: &dyn Session, args: ScanArgs<'a>) -> Result<ScanResult> {
        let result = self.inner.scan_with_args(state, args).await?;
        self.check(result.plan())?;
        Ok(result)
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}

/// A read-only view of the catalog, read afresh at every scan (`schema_ref()` and `batch()`).
macro_rules! catalog_view {
    ($(#[$doc:meta])* $view:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $view {
            catalog: Arc<Catalog>,
            analyst: Option<String>,
        }

        impl $view {
            /// The view over `catalog` as `analyst`'s session sees it (None: the table owner's).
            pub fn new(catalog: Arc<Catalog>, analyst: Option<String>) -> Self {
                Self { catalog, analyst }
            }
        }

        #[async_trait]
        impl TableProvider for $view {
            fn schema(&self) -> SchemaRef {
                Self::schema_ref()
            }

            fn table_type(&self) -> TableType {
                TableType::View
            }

            async fn scan(
                &self,
                state: &dyn Session,
                projection: Option<&Vec<usize>>,
                filters: &[Expr],
                limit: Option<usize>,
            ) -> Result<Arc<dyn ExecutionPlan>> {
                let mem = MemTable::try_new(Self::schema_ref(), vec![vec![self.batch()?]])?;
                mem.scan(state, projection, filters, limit).await
            }
        }
    };
}

catalog_view! {
    /// `dpcurve.budgets`: one row per private table with its total, spent and remaining
    /// budget, read from the ledger at scan time. Budgets depend only on past public
    /// parameters, so showing them to analysts reveals nothing about the data.
    BudgetsTable
}

impl BudgetsTable {
    fn schema_ref() -> SchemaRef {
        let f = |n: &str| Field::new(n, DataType::Float64, false);
        Arc::new(Schema::new(vec![
            Field::new("table_name", DataType::Utf8, false),
            f("epsilon_total"),
            f("delta_total"),
            f("epsilon_spent"),
            f("delta_spent"),
            f("epsilon_remaining"),
            f("delta_remaining"),
            Field::new("releases", DataType::Int64, false),
            // The session's analyst's share (NULL in the table owner's sessions; 0 without a grant).
            Field::new("share_epsilon_remaining", DataType::Float64, true),
            Field::new("share_delta_remaining", DataType::Float64, true),
        ]))
    }

    fn batch(&self) -> Result<RecordBatch> {
        let tables = self.catalog.tables().map_err(|e| DataFusionError::External(Box::new(e)))?;
        let counts = self.catalog.release_counts().map_err(|e| DataFusionError::External(Box::new(e)))?;
        let private: Vec<_> = tables.into_iter().filter_map(|t| t.policy.map(|p| (t.name, p))).collect();
        let grants = match &self.analyst {
            None => None,
            Some(a) => Some(
                self.catalog
                    .analysts()
                    .map_err(|e| DataFusionError::External(Box::new(e)))?
                    .into_iter()
                    .find(|x| &x.name == a)
                    .map(|x| x.grants)
                    .unwrap_or_default(),
            ),
        };
        let shares: Vec<Option<crate::mechanism::noise::budget::Budget>> = private
            .iter()
            .map(|(n, _)| {
                grants.as_ref().map(|g| {
                    g.iter()
                        .find(|g| &g.table == n)
                        .map(|g| g.remaining())
                        .unwrap_or(crate::mechanism::noise::budget::Budget::ZERO)
                })
            })
            .collect();
        let col = |f: &dyn Fn(&super::catalog::Policy) -> f64| -> Arc<Float64Array> {
            Arc::new(private.iter().map(|(_, p)| f(p)).collect::<Float64Array>())
        };
        Ok(RecordBatch::try_new(
            Self::schema_ref(),
            vec![
                Arc::new(private.iter().map(|(n, _)| Some(n.as_str())).collect::<StringArray>()),
                col(&|p| p.total.epsilon()),
                col(&|p| p.total.delta()),
                col(&|p| p.spent.epsilon()),
                col(&|p| p.spent.delta()),
                col(&|p| p.remaining().epsilon()),
                col(&|p| p.remaining().delta()),
                Arc::new(private.iter().map(|(n, _)| counts.get(n).copied().unwrap_or(0)).collect::<Int64Array>()),
                Arc::new(shares.iter().map(|s| s.map(|b| b.epsilon())).collect::<Float64Array>()),
                Arc::new(shares.iter().map(|s| s.map(|b| b.delta())).collect::<Float64Array>()),
            ],
        )?)
    }
}

catalog_view! {
    /// `dpcurve.releases`: the stored releases of the catalog (an analyst's session
    /// lists only that analyst's) — id, table, function,
    /// public parameters, what the call cost, its ledger entry, time and query. Re-reading costs
    /// nothing: use `release(id)` or `release_eval(id, x)`.
    ReleasesTable
}

impl ReleasesTable {
    fn schema_ref() -> SchemaRef {
        let text = |n: &str| Field::new(n, DataType::Utf8, false);
        Arc::new(Schema::new(vec![
            text("release"),
            text("table_name"),
            text("function"),
            text("parameters"),
            Field::new("epsilon", DataType::Float64, false),
            Field::new("delta", DataType::Float64, false),
            Field::new("charge", DataType::Int64, false),
            text("at"),
            text("query"),
            Field::new("analyst", DataType::Utf8, true),
            Field::new("execution", DataType::Int64, false),
            text("statement_sha256"),
        ]))
    }

    fn batch(&self) -> Result<RecordBatch> {
        let rows = self
            .catalog
            .stored_releases_of(None, self.analyst.as_deref())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let text = |f: &dyn Fn(&super::catalog::StoredReleaseRecord) -> &str| -> ArrayRef {
            Arc::new(rows.iter().map(|r| Some(f(r))).collect::<StringArray>())
        };
        Ok(RecordBatch::try_new(
            Self::schema_ref(),
            vec![
                text(&|r| &r.release),
                text(&|r| &r.table),
                text(&|r| &r.function),
                text(&|r| &r.parameters),
                Arc::new(rows.iter().map(|r| r.cost.epsilon()).collect::<Float64Array>()),
                Arc::new(rows.iter().map(|r| r.cost.delta()).collect::<Float64Array>()),
                Arc::new(rows.iter().map(|r| r.charge).collect::<Int64Array>()),
                text(&|r| &r.at),
                text(&|r| &r.query),
                Arc::new(rows.iter().map(|r| r.analyst.as_deref()).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| r.execution).collect::<Int64Array>()),
                text(&|r| &r.statement_sha256),
            ],
        )?)
    }
}

catalog_view! {
    /// `dpcurve.results`: the paid executions whose whole result a server kept (an analyst's
    /// session lists only that analyst's) — execution, time, the statement's SHA-256 and text, and
    /// the kept Arrow stream's size. Re-reading costs nothing: `SELECT * FROM stored_result(execution)`.
    ResultsTable
}

impl ResultsTable {
    fn schema_ref() -> SchemaRef {
        let text = |n: &str| Field::new(n, DataType::Utf8, false);
        Arc::new(Schema::new(vec![
            Field::new("execution", DataType::Int64, false),
            text("at"),
            text("statement_sha256"),
            text("query"),
            Field::new("bytes", DataType::Int64, false),
            Field::new("analyst", DataType::Utf8, true),
        ]))
    }

    fn batch(&self) -> Result<RecordBatch> {
        let rows = self
            .catalog
            .stored_results_of(self.analyst.as_deref())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let text = |f: &dyn Fn(&super::catalog::StoredResultRecord) -> &str| -> ArrayRef {
            Arc::new(rows.iter().map(|r| Some(f(r))).collect::<StringArray>())
        };
        Ok(RecordBatch::try_new(
            Self::schema_ref(),
            vec![
                Arc::new(rows.iter().map(|r| r.execution).collect::<Int64Array>()),
                text(&|r| &r.at),
                text(&|r| &r.statement_sha256),
                text(&|r| &r.query),
                Arc::new(rows.iter().map(|r| r.bytes).collect::<Int64Array>()),
                Arc::new(rows.iter().map(|r| r.analyst.as_deref()).collect::<StringArray>()),
            ],
        )?)
    }
}

/// Whether a provider is a private table (and which).
pub fn as_private(provider: &dyn TableProvider) -> Option<&PrivateTable> {
    (provider as &dyn Any).downcast_ref::<PrivateTable>()
}
