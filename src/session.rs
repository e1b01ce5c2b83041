//! `DpSession`: a DataFusion session with the private aggregates and the planner guard
//! installed, driven by SQL text only.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::Result;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::ParquetReadOptions;
use datafusion::sql::parser::DFParser;
use datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::functions::{all_params, named_args, private_udafs};
use crate::guard::PrivacyPlanner;
use crate::mechanism::NoiseSource;

/// How a session is set up.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Parallelism of scans and partial aggregation (None: number of cores).
    pub target_partitions: Option<usize>,
    /// Randomness of releases. Only the Rust API can choose anything but the OS.
    pub noise: NoiseSource,
    /// Allow DDL (CREATE EXTERNAL TABLE, CREATE VIEW …), DML and SET statements.
    pub allow_statements: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self { target_partitions: None, noise: NoiseSource::Os, allow_statements: true }
    }
}

/// The result of one SQL statement.
#[derive(Debug, Clone)]
pub struct QueryOutput {
    /// Output schema (also for empty results).
    pub schema: SchemaRef,
    /// Result rows.
    pub batches: Vec<RecordBatch>,
}

/// A SQL session with dpcurve's private aggregates.
pub struct DpSession {
    ctx: SessionContext,
    options: SQLOptions,
}

impl DpSession {
    /// A new session.
    pub fn new(opts: SessionOptions) -> Self {
        let mut config = SessionConfig::new().with_information_schema(true);
        if let Some(n) = opts.target_partitions {
            config = config.with_target_partitions(n.max(1));
        }
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(Arc::new(PrivacyPlanner::default()))
            .build();
        let ctx = SessionContext::new_with_state(state);
        for udaf in private_udafs(opts.noise) {
            ctx.register_udaf(udaf);
        }
        let options = SQLOptions::new()
            .with_allow_ddl(opts.allow_statements)
            .with_allow_dml(opts.allow_statements)
            .with_allow_statements(opts.allow_statements);
        Self { ctx, options }
    }

    /// Registers a Parquet file or directory (all its files form one table).
    pub async fn register_parquet(&self, name: &str, path: &str) -> Result<()> {
        self.ctx.register_parquet(name, path, ParquetReadOptions::default()).await
    }

    /// Runs every statement in `sql` in order and returns their results.
    /// All statements are parsed before the first one runs.
    pub async fn sql(&self, sql: &str) -> Result<Vec<QueryOutput>> {
        let mut statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
        let params = all_params();
        for stmt in statements.iter_mut() {
            named_args::normalize_statement(stmt, &params)?;
        }
        let mut out = Vec::with_capacity(statements.len());
        for stmt in statements {
            let plan = self.ctx.state().statement_to_plan(stmt).await?;
            self.options.verify_plan(&plan)?;
            let df = self.ctx.execute_logical_plan(plan).await?;
            let schema = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await?;
            out.push(QueryOutput { schema, batches });
        }
        Ok(out)
    }

    /// Runs exactly one statement and returns its rows.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        let mut results = self.sql(sql).await?;
        match results.len() {
            1 => Ok(results.pop().expect("one result").batches),
            n => datafusion::common::plan_err!("expected exactly one SQL statement, got {n}"),
        }
    }
}
