//! SQL sessions with dpcurve's private aggregates and planner guard installed.
//!
//! * [`DpSession`] — a free session over public files (`dpcurve sql --table`): any SQL.
//! * [`AnalystSession`] — a catalog session (`dpcurve sql --catalog`): tables come from the
//!   catalog, private tables are charged on its ledger, only queries run. It is a narrow
//!   facade: it never hands out the DataFusion context, a DataFrame or a plan.
//! * [`Admin`] — the data owner's operations on a catalog.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
#[cfg(feature = "test-hooks")]
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::ParquetReadOptions;

use crate::functions::{Permits, private_udafs};
use crate::guard::PrivacyPlanner;
use crate::guard::passes::column_types::narrow_index;
use crate::mechanism::NoiseSource;
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::noise::cache::set_public_store;
use crate::policy::public_store::DiskStore;
use crate::policy::{
    BudgetsTable, Catalog, PolicyError, QueryRecord, ReleaseRecord, ReleasesTable, ResultsTable, StoredReleaseRecord,
    TableInfo,
};

mod catalog_schema;
mod reading;
use catalog_schema::{CatalogSchema, parquet_provider};
use reading::{catalog_config, catalog_runtime, listed_files, read_whole};

/// How a session is set up.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Parallelism of scans and partial aggregation (None: number of cores).
    pub target_partitions: Option<usize>,
    /// Randomness of releases. Only the Rust API can choose anything but the OS.
    pub noise: NoiseSource,
    /// Allow DDL (CREATE EXTERNAL TABLE, CREATE VIEW …), DML and SET statements. Always
    /// off in analyst sessions.
    pub allow_statements: bool,
    /// Cluster mode: `df://HOST:PORT[?job_timeout=SECS]` of a Ballista scheduler
    /// running dpcurve's executors (`dpcurve scheduler`, `dpcurve executor`). Partial aggregation runs there; the
    /// guard, the ledger and every release stay in this process. Needs the `cluster` feature.
    pub cluster: Option<String>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self { target_partitions: None, noise: NoiseSource::Os, allow_statements: true, cluster: None }
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

/// A DataFusion context with the private aggregates, the guard and the SQL front end.
struct Engine {
    ctx: SessionContext,
    options: SQLOptions,
    /// Queries only (analyst sessions): every statement is planned before any runs.
    queries_only: bool,
}

impl Engine {
    fn new(opts: &SessionOptions, ledger: Option<Arc<Catalog>>, analyst: Option<&str>) -> Result<Self> {
        let mut config = SessionConfig::new().with_information_schema(true);
        if let Some(n) = opts.target_partitions {
            config = config.with_target_partitions(n.max(1));
        }
        if ledger.is_some() {
            config = catalog_config(config);
        }
        let ledger_session = ledger.is_some();
        let mut runtime = None;
        let planner = match ledger {
            Some(l) => {
                // Analyst sessions run under the catalog's memory limit; the planner refuses
                // queries whose private states would not fit (SPEC §5.1).
                let limit = l.memory_limit().map_err(|e| DataFusionError::Plan(e.to_string()))?;
                runtime = Some(catalog_runtime(Some(usize::try_from(limit).unwrap_or(usize::MAX)))?);
                PrivacyPlanner::with_ledger(l, limit).for_analyst(analyst)
            }
            None => PrivacyPlanner::default(),
        };
        let planner = with_cluster(planner, opts.cluster.as_deref())?;
        let mut state = SessionStateBuilder::new();
        if let Some(rt) = runtime {
            state = state.with_runtime_env(rt);
        }
        let state = state.with_config(config).with_default_features().with_query_planner(Arc::new(planner)).build();
        let ctx = SessionContext::new_with_state(state);
        // Catalog sessions: releases need a permit from the budget gate (SPEC §5.1).
        let permits = if ledger_session { Permits::Denied } else { Permits::Free };
        for udaf in private_udafs(opts.noise, permits) {
            ctx.register_udaf(udaf);
        }
        // Free post-processing of released curves (SPEC §0).
        for udf in crate::functions::post::curve_udfs() {
            ctx.register_udf(udf);
        }
        let allow = opts.allow_statements;
        let options = SQLOptions::new().with_allow_ddl(allow).with_allow_dml(allow).with_allow_statements(allow);
        Ok(Self { ctx, options, queries_only: !allow })
    }

    /// Parses all statements, then plans and runs them in order (in analyst sessions: plans
    /// all of them before running the first).
    async fn run(&self, sql: &str) -> Result<Vec<QueryOutput>> {
        let mut out = Vec::new();
        self.run_each(sql, &mut |r| {
            out.push(r);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// [`Engine::run`], handing each statement's result to `done` as soon as it completes, so a
    /// later statement's failure (a budget that covered only the first, a failing public
    /// query) never takes an earlier, paid result with it.
    async fn run_each(&self, sql: &str, done: &mut (dyn FnMut(QueryOutput) -> Result<()> + Send)) -> Result<()> {
        let statements = crate::statements::parse(sql)?;
        if self.queries_only {
            // Analyst sessions (queries only): plan every statement — guard and pricing
            // included — before executing any, so a refusal of statement k cannot come after
            // statements 1…k−1 were paid for.
            let mut planned = Vec::with_capacity(statements.len());
            for stmt in statements {
                let (plan, state) = self.plan(stmt, None).await?;
                let df = DataFrame::new(state, plan);
                let schema = Arc::new(df.schema().as_arrow().clone());
                let task = Arc::new(df.task_ctx());
                planned.push((schema, df.create_physical_plan().await?, task));
            }
            for (schema, physical, task) in planned {
                let batches = datafusion::physical_plan::collect(physical, task).await?;
                done(QueryOutput { schema, batches })?;
            }
            return Ok(());
        }
        for stmt in statements {
            let (plan, state) = self.plan(stmt, None).await?;
            let df = match plan {
                LogicalPlan::Ddl(_) | LogicalPlan::Statement(_) => self.ctx.execute_logical_plan(plan).await?,
                plan => DataFrame::new(state, plan),
            };
            let schema = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await?;
            done(QueryOutput { schema, batches })?;
        }
        Ok(())
    }

    async fn plan(
        &self,
        stmt: datafusion::sql::parser::Statement,
        ticket: Option<&[u8]>,
    ) -> Result<(LogicalPlan, datafusion::execution::session_state::SessionState)> {
        // The statement's record (its bounded text, and the server ticket it is planned for)
        // travels with the state to the gate (release log).
        let record = QueryRecord::of(&stmt.to_string());
        let record = match ticket {
            Some(handle) => record.for_ticket(handle),
            None => record,
        };
        let config = self
            .ctx
            .state()
            .config()
            .clone()
            .with_create_default_catalog_and_schema(false) // keep the session's catalog
            .with_extension(Arc::new(record));
        let state = SessionStateBuilder::new_from_existing(self.ctx.state()).with_config(config).build();
        let plan = state.statement_to_plan(stmt).await?;
        self.options.verify_plan(&plan)?;
        Ok((plan, state))
    }

    #[cfg(feature = "test-hooks")]
    async fn physical_plan(&self, sql: &str) -> Result<Arc<dyn ExecutionPlan>> {
        let mut statements = crate::statements::parse(sql)?;
        if statements.len() != 1 {
            return datafusion::common::plan_err!("expected exactly one SQL statement, got {}", statements.len());
        }
        let stmt = statements.pop_front().expect("one statement");
        let (plan, state) = self.plan(stmt, None).await?;
        state.create_physical_plan(&plan).await
    }
}

/// The planner, sending partial aggregation to `cluster` (if given).
#[cfg(feature = "cluster")]
fn with_cluster(planner: PrivacyPlanner, cluster: Option<&str>) -> Result<PrivacyPlanner> {
    let cluster = cluster.map(crate::cluster::Cluster::parse).transpose().map_err(DataFusionError::Plan)?;
    Ok(planner.distributed(cluster.map(|c| Arc::new(c) as Arc<dyn crate::guard::Distributor>)))
}

/// Without the `cluster` feature a cluster cannot be used.
#[cfg(not(feature = "cluster"))]
fn with_cluster(planner: PrivacyPlanner, cluster: Option<&str>) -> Result<PrivacyPlanner> {
    match cluster {
        None => Ok(planner),
        Some(_) => datafusion::common::plan_err!("this dpcurve was built without cluster support (feature 'cluster')"),
    }
}

fn exactly_one(mut results: Vec<QueryOutput>) -> Result<Vec<RecordBatch>> {
    match results.len() {
        1 => Ok(results.pop().expect("one result").batches),
        n => datafusion::common::plan_err!("expected exactly one SQL statement, got {n}"),
    }
}

/// A SQL session over public files: everything DataFusion offers, plus the private
/// aggregates (useful on public data and for trying them out).
pub struct DpSession {
    engine: Engine,
}

impl DpSession {
    /// A new session. Panics on options [`DpSession::try_new`] refuses (a cluster address).
    pub fn new(opts: SessionOptions) -> Self {
        // Only catalog sessions read settings or build a runtime; a malformed cluster address
        // is the only other failure.
        Self { engine: Engine::new(&opts, None, None).expect("a session without a catalog cannot fail to start") }
    }

    /// A new session, or an error if its options cannot be used (a malformed cluster address,
    /// or a cluster without the `cluster` feature).
    pub fn try_new(opts: SessionOptions) -> Result<Self> {
        Ok(Self { engine: Engine::new(&opts, None, None)? })
    }

    /// Registers a Parquet file or directory (all its files form one table).
    pub async fn register_parquet(&self, name: &str, path: &str) -> Result<()> {
        self.engine.ctx.register_parquet(name, path, ParquetReadOptions::default()).await
    }

    /// Runs every statement in `sql` in order and returns their results.
    /// All statements are parsed before the first one runs.
    pub async fn sql(&self, sql: &str) -> Result<Vec<QueryOutput>> {
        self.engine.run(sql).await
    }

    /// Runs every statement in `sql` in order, handing each result to `done` as it completes.
    pub async fn sql_each(&self, sql: &str, done: &mut (dyn FnMut(QueryOutput) -> Result<()> + Send)) -> Result<()> {
        self.engine.run_each(sql, done).await
    }

    /// Runs exactly one statement and returns its rows.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        exactly_one(self.sql(sql).await?)
    }

    /// The physical plan of one statement (tests compare it with a catalog session's).
    #[cfg(feature = "test-hooks")]
    pub async fn physical_plan_for_tests(&self, sql: &str) -> Result<Arc<dyn ExecutionPlan>> {
        self.engine.physical_plan(sql).await
    }
}

/// An analyst's session on a catalog: tables come from the catalog, private tables can
/// only be read through private aggregates and each execution is charged on the ledger
/// before any row is read; DDL, DML, COPY, SET and reading files by path are refused.
pub struct AnalystSession {
    engine: Engine,
    catalog: Arc<Catalog>,
    analyst: Option<String>,
}

impl AnalystSession {
    /// Opens an analyst session on an existing catalog file. `opts.allow_statements` is
    /// ignored (always false).
    pub async fn open(catalog: &Path, opts: SessionOptions) -> Result<Self> {
        let catalog = Arc::new(Catalog::open(catalog).map_err(|e| DataFusionError::Plan(e.to_string()))?);
        Self::with_catalog(catalog, opts).await
    }

    /// An analyst session on an already opened catalog, as the table owner (no principal:
    /// releases are charged on the tables' totals only and logged without an analyst).
    pub async fn with_catalog(catalog: Arc<Catalog>, opts: SessionOptions) -> Result<Self> {
        Self::with_principal(catalog, opts, None).await
    }

    /// An analyst session for the authenticated analyst `analyst` (None: the table
    /// owner): releases are charged on the tables' totals and on the analyst's shares, the log
    /// records the analyst, and `dpcurve.budgets`, `dpcurve.releases` and `release(id)` show
    /// the analyst's own shares and releases.
    pub async fn with_principal(catalog: Arc<Catalog>, opts: SessionOptions, analyst: Option<&str>) -> Result<Self> {
        let opts = SessionOptions { allow_statements: false, ..opts };
        // Locations are re-checked as the session opens: files and links can appear in a
        // directory after registration (SPEC §5.2).
        catalog.check_locations().map_err(|e| DataFusionError::Plan(e.to_string()))?;
        // Simulated band quantiles persist beside the catalog (public values only).
        set_public_store(Some(Arc::new(DiskStore::beside(catalog.path()))));
        let engine = Engine::new(&opts, Some(Arc::clone(&catalog)), analyst)?;
        // The catalog's tables, each opened when a statement first names it (`catalog_schema`).
        let tables = catalog.tables().map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let state = engine.ctx.state();
        let tables =
            CatalogSchema::new(Arc::clone(&catalog), tables, state.config().clone(), Arc::clone(state.runtime_env()));
        let catalogs = engine
            .ctx
            .catalog("datafusion")
            .ok_or_else(|| DataFusionError::Internal("default catalog missing".into()))?;
        catalogs.register_schema(&state.config_options().catalog.default_schema, Arc::new(tables))?;
        let schema = Arc::new(MemorySchemaProvider::new());
        let who = analyst.map(str::to_string);
        schema.register_table("budgets".into(), Arc::new(BudgetsTable::new(Arc::clone(&catalog), who.clone())))?;
        schema.register_table("releases".into(), Arc::new(ReleasesTable::new(Arc::clone(&catalog), who.clone())))?;
        schema.register_table("results".into(), Arc::new(ResultsTable::new(Arc::clone(&catalog), who.clone())))?;
        engine.ctx.register_udf(statement_sha256_udf());
        engine.ctx.register_udtf(
            "stored_result",
            Arc::new(crate::policy::results::StoredResultFunction::new(Arc::clone(&catalog), who.clone())),
        );
        // Stored releases: evaluated and re-read without data or budget.
        let reader = crate::guard::ScopedReleases { catalog: Arc::clone(&catalog), analyst: who.clone() };
        let (eval, table) = crate::functions::releases::release_functions(Arc::new(reader));
        engine.ctx.register_udf(eval);
        engine.ctx.register_udtf("release", table);
        catalogs.register_schema("dpcurve", schema)?;
        Ok(Self { engine, catalog, analyst: who })
    }

    /// Runs every statement in `sql` in order (only queries are allowed). Every statement is
    /// planned and priced before the first runs; when a later one fails at run time (its budget
    /// exhausted by the earlier ones, say), the earlier results are lost to this call — use
    /// [`AnalystSession::sql_each`] to receive each as it completes.
    pub async fn sql(&self, sql: &str) -> Result<Vec<QueryOutput>> {
        self.engine.run(sql).await
    }

    /// Runs every statement in `sql` in order, handing each result to `done` as soon as it
    /// completes (before the next statement runs).
    pub async fn sql_each(&self, sql: &str, done: &mut (dyn FnMut(QueryOutput) -> Result<()> + Send)) -> Result<()> {
        self.engine.run_each(sql, done).await
    }

    /// Runs exactly one query and returns its rows.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        exactly_one(self.sql(sql).await?)
    }

    /// Plans exactly one query — parsing, the guard and pricing included — without running
    /// it: a refusal comes here, and nothing is charged. The result is opaque: it can only be
    /// run by [`AnalystSession::execute`], through its budget gate (servers plan at
    /// GetFlightInfo and run at DoGet).
    pub async fn plan(&self, sql: &str) -> Result<PlannedQuery> {
        self.plan_inner(sql, None).await
    }

    /// [`AnalystSession::plan`] for the server ticket with handle `ticket`: the ledger records
    /// the ticket (hashed) with the query's charges, so a ticket that is gone can still be
    /// answered with the releases it paid for ([`Catalog::releases_of_ticket`]).
    pub async fn plan_for_ticket(&self, sql: &str, ticket: &[u8]) -> Result<PlannedQuery> {
        self.plan_inner(sql, Some(ticket)).await
    }

    async fn plan_inner(&self, sql: &str, ticket: Option<&[u8]>) -> Result<PlannedQuery> {
        let mut statements = crate::statements::parse(sql)?;
        if statements.len() != 1 {
            return datafusion::common::plan_err!("expected exactly one SQL statement, got {}", statements.len());
        }
        let stmt = statements.pop_front().expect("one statement");
        let (plan, state) = self.engine.plan(stmt, ticket).await?;
        let df = DataFrame::new(state, plan);
        let task = Arc::new(df.task_ctx());
        let physical = df.create_physical_plan().await?;
        Ok(PlannedQuery { schema: physical.schema(), physical, task })
    }

    /// Runs a planned query: its gate debits the ledger (and the analyst's share) before any
    /// row is read, exactly as [`AnalystSession::query`] does.
    pub async fn execute(&self, planned: PlannedQuery) -> Result<Vec<RecordBatch>> {
        datafusion::physical_plan::collect(planned.physical, planned.task).await
    }

    /// [`AnalystSession::execute`], as a stream of batches (the debit comes with the first poll).
    pub fn execute_stream(&self, planned: PlannedQuery) -> Result<datafusion::execution::SendableRecordBatchStream> {
        datafusion::physical_plan::execute_stream(planned.physical, planned.task)
    }

    /// The tables an analyst may name: (schema, table, type, columns) — the catalog's tables in
    /// `public`, the `dpcurve` views. Column names and types are public metadata
    /// (`information_schema` shows them too). Without `with_columns` no table is opened (the
    /// columns are left empty); with them, a table whose files cannot be opened is left out of
    /// the listing rather than failing it (a statement naming it gets the reason).
    pub async fn table_schemas(&self, with_columns: bool) -> Result<Vec<(String, String, String, SchemaRef)>> {
        let mut out = Vec::new();
        let catalog = self
            .engine
            .ctx
            .catalog("datafusion")
            .ok_or_else(|| DataFusionError::Internal("default catalog missing".into()))?;
        for schema_name in ["public", "dpcurve"] {
            let Some(schema) = catalog.schema(schema_name) else { continue };
            let mut names = schema.table_names();
            names.sort();
            for name in names {
                let kind = |t: datafusion::logical_expr::TableType| match t {
                    datafusion::logical_expr::TableType::View => "VIEW",
                    _ => "TABLE",
                };
                let (kind, columns) = if with_columns {
                    match schema.table(&name).await {
                        Ok(Some(t)) => (kind(t.table_type()), t.schema()),
                        Ok(None) | Err(_) => continue,
                    }
                } else {
                    match schema.table_type(&name).await {
                        Ok(Some(t)) => (kind(t), Arc::new(datafusion::arrow::datatypes::Schema::empty())),
                        Ok(None) | Err(_) => continue,
                    }
                };
                out.push((schema_name.to_string(), name, kind.to_string(), columns));
            }
        }
        Ok(out)
    }

    /// The analyst of this session (None: the table owner's session).
    pub fn analyst(&self) -> Option<&str> {
        self.analyst.as_deref()
    }

    /// Remaining budgets of the private tables: (table, total, spent, remaining).
    pub fn budgets(&self) -> Result<Vec<(String, Budget, Budget, Budget)>> {
        let tables = self.catalog.tables().map_err(|e| DataFusionError::Plan(e.to_string()))?;
        Ok(tables.into_iter().filter_map(|t| t.policy.map(|p| (t.name, p.total, p.spent, p.remaining()))).collect())
    }

    /// Test support: the physical plan of one query, to check that executing the same
    /// plan twice pays twice. Only with the `test-hooks` feature: a plan in an analyst's
    /// hands could be executed below its gate.
    #[cfg(feature = "test-hooks")]
    pub async fn physical_plan_for_tests(&self, sql: &str) -> Result<Arc<dyn ExecutionPlan>> {
        self.engine.physical_plan(sql).await
    }

    /// Test support: a task context of this session (`test-hooks` feature only).
    #[cfg(feature = "test-hooks")]
    pub fn task_ctx_for_tests(&self) -> Arc<datafusion::execution::TaskContext> {
        self.engine.ctx.task_ctx()
    }
}

/// One planned query of an [`AnalystSession`] (see [`AnalystSession::plan`]): its output
/// schema is known, and it runs only through the session's budget gate.
pub struct PlannedQuery {
    schema: SchemaRef,
    physical: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    task: Arc<datafusion::execution::TaskContext>,
}

impl PlannedQuery {
    /// The schema of the rows the query returns (exactly the schema of its batches).
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Whether running it debits the ledger (it reads a private table).
    pub fn is_charged(&self) -> bool {
        self.physical.downcast_ref::<crate::guard::BudgetGateExec>().is_some()
    }
}

impl std::fmt::Debug for PlannedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedQuery").field("schema", &self.schema).finish_non_exhaustive()
    }
}

/// A data owner's operations on a catalog.
pub struct Admin {
    catalog: Arc<Catalog>,
    path: std::path::PathBuf,
}

impl Admin {
    /// Opens a catalog, creating it if the file does not exist.
    pub fn open(path: &Path) -> std::result::Result<Self, PolicyError> {
        Ok(Self { catalog: Arc::new(Catalog::create_or_open(path)?), path: path.to_path_buf() })
    }

    /// The underlying catalog (for analyst sessions in the same process).
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    async fn schema_of(location: &str) -> std::result::Result<SchemaRef, PolicyError> {
        let provider = parquet_provider(&SessionContext::new().state(), location)
            .await
            .map_err(|e| PolicyError::Invalid(format!("cannot read {location} as Parquet: {e}")))?;
        Ok(provider.schema())
    }

    /// Registers a Parquet file or directory as a public table (checks it is readable). The
    /// location is stored as a canonical absolute path (symbolic links resolved), so sessions
    /// started anywhere read the same files and aliases of a private table's files are
    /// recognised (SPEC §5.2).
    pub async fn register(&self, name: &str, location: &str) -> std::result::Result<(), PolicyError> {
        let canonical = std::fs::canonicalize(location)
            .map_err(|e| PolicyError::Invalid(format!("cannot read {location}: {e}")))?;
        let canonical = canonical
            .to_str()
            .ok_or_else(|| PolicyError::Invalid(format!("{location} is not a UTF-8 path")))?
            .to_string();
        Self::schema_of(&canonical).await?;
        self.catalog.register_table(name, &canonical)
    }

    /// Makes a table private with a total budget (ε ≥ 0, 0 ≤ δ ≤ 1), after reading its files
    /// whole as analyst sessions would (see [`Admin::verify`]): a table with a row the reader
    /// cannot decode stays public, and the error names the reason.
    pub async fn make_private(&self, name: &str, epsilon: f64, delta: f64) -> std::result::Result<(), PolicyError> {
        let total = Budget::total(epsilon, delta).map_err(|e| PolicyError::Invalid(e.to_string()))?;
        let files = Self::read_files_whole(&self.table_info(name)?).await?;
        self.catalog.make_private(name, total)?;
        self.catalog.record_verification(name, &files)
    }

    /// Reads every column of every file of the private table `name` as analyst sessions would and
    /// records the files read (location, size, modification time): analysts' queries read those
    /// files only, unchanged, so no row can make one fail (SPEC §0;
    /// [`crate::policy::verified_files`]). The data owner runs it after changing, adding or
    /// removing the files. Returns the number of files read. If a file cannot be read whole,
    /// the earlier verification stays in force and the error names the reason.
    pub async fn verify(&self, name: &str) -> std::result::Result<usize, PolicyError> {
        let table = self.table_info(name)?;
        if table.policy.is_none() {
            return Err(PolicyError::Invalid(format!(
                "table '{name}' is public: only private tables' files are verified (make-private verifies them)"
            )));
        }
        let files = Self::read_files_whole(&table).await?;
        self.catalog.record_verification(name, &files)?;
        Ok(files.len())
    }

    /// Whether the files of the private table `name` differ from those its last verification
    /// read (a file added, or one with another size or modification time), so that analysts'
    /// queries over it are refused until [`Admin::verify`]; None if it was never verified. Lists
    /// the files and reads their footers, no row.
    pub async fn files_changed(&self, name: &str) -> std::result::Result<Option<bool>, PolicyError> {
        let table = self.table_info(name)?;
        let Some(verified) = table.policy.and_then(|p| p.verified) else { return Ok(None) };
        let now = listed_files(&table.location)
            .await
            .map_err(|e| PolicyError::Invalid(format!("cannot list the files of '{name}': {e}")))?;
        Ok(Some(!crate::policy::verified_files::all_verified(&verified, &now)))
    }

    /// A registered table.
    fn table_info(&self, name: &str) -> std::result::Result<TableInfo, PolicyError> {
        self.catalog.table(name)?.ok_or_else(|| PolicyError::Invalid(format!("no table named '{name}' in the catalog")))
    }

    /// The files of `table`, read whole (see [`Admin::verify`]).
    async fn read_files_whole(table: &TableInfo) -> std::result::Result<Vec<crate::policy::VerifiedFile>, PolicyError> {
        let name = &table.name;
        read_whole(&table.location).await.map_err(|e| {
            PolicyError::Invalid(format!(
                "the files of '{name}' ({}) cannot be read whole: {e}. A query reading the rows that fail would \
                 fail where the same table without them succeeds (SPEC §0), so they cannot be private data: \
                 rewrite or remove them",
                table.location
            ))
        })
    }

    /// Adds budget to a private table; returns the new total.
    pub fn raise_budget(&self, name: &str, epsilon: f64, delta: f64) -> std::result::Result<Budget, PolicyError> {
        let extra = Budget::total(epsilon, delta).map_err(|e| PolicyError::Invalid(e.to_string()))?;
        self.catalog.raise_budget(name, extra)
    }

    /// Sets public bounds for a numeric column of a private table.
    pub async fn set_bounds(
        &self,
        name: &str,
        column: &str,
        lower: f64,
        upper: f64,
    ) -> std::result::Result<(), PolicyError> {
        let t = self.column_type(name, column).await?;
        let numeric = t.is_numeric()
            || matches!(&t, DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) if f.data_type().is_numeric());
        if !numeric {
            return Err(PolicyError::Invalid(format!("column '{column}' of '{name}' is {t}, not numeric")));
        }
        self.catalog.set_bounds(name, column, lower, upper)
    }

    /// Rewrites relative locations (stored by dpcurve before locations were canonical) as
    /// canonical absolute paths, resolving them against `base` (default: the catalog file's
    /// directory). Returns (table, old, new) per migrated table; a location that cannot be
    /// found, or that would reach a private table's files, is an error and nothing after it
    /// is changed.
    pub fn migrate_locations(
        &self,
        base: Option<&Path>,
    ) -> std::result::Result<Vec<(String, String, String)>, PolicyError> {
        let default_base = std::fs::canonicalize(&self.path)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| std::path::PathBuf::from("."));
        let base = base.map(Path::to_path_buf).unwrap_or(default_base);
        let mut done = Vec::new();
        for (name, old) in self.catalog.relative_locations()? {
            let joined = base.join(&old);
            let canonical = std::fs::canonicalize(&joined).map_err(|e| {
                PolicyError::Invalid(format!(
                    "table '{name}': {old} resolved against {} is {}: {e}; pass the directory it was \
                     registered from",
                    base.display(),
                    joined.display()
                ))
            })?;
            let canonical = canonical
                .to_str()
                .ok_or_else(|| PolicyError::Invalid(format!("{} is not a UTF-8 path", canonical.display())))?
                .to_string();
            self.catalog.relocate(&name, &canonical)?;
            done.push((name, old, canonical));
        }
        Ok(done)
    }

    /// Sets the memory limit of analyst sessions on this catalog (bytes).
    pub fn set_memory_limit(&self, bytes: u64) -> std::result::Result<(), PolicyError> {
        self.catalog.set_memory_limit(bytes)
    }

    /// The memory limit of analyst sessions on this catalog (bytes).
    pub fn memory_limit(&self) -> std::result::Result<u64, PolicyError> {
        self.catalog.memory_limit()
    }

    /// Declares the privacy unit of a private table (SPEC §7): neighbouring tables then differ
    /// by all rows of one unit. Until per-unit contribution bounding is available, private
    /// aggregates over such a table are refused (rule `privacy-unit`), never run with row-level
    /// sensitivity.
    pub async fn set_privacy_unit(
        &self,
        name: &str,
        column: &str,
        max_rows: i64,
        max_groups: i64,
    ) -> std::result::Result<(), PolicyError> {
        self.readable_column_type(name, column).await?;
        self.catalog.set_privacy_unit(name, column, max_rows, max_groups)
    }

    /// The type of a registered table's column.
    async fn column_type(&self, name: &str, column: &str) -> std::result::Result<DataType, PolicyError> {
        let schema = Self::schema_of(&self.table_info(name)?.location).await?;
        let field = schema
            .field_with_name(column)
            .map_err(|_| PolicyError::Invalid(format!("table '{name}' has no column '{column}'")))?;
        Ok(field.data_type().clone())
    }

    /// The type of a column analyst queries may read: not a dictionary with 8- or 16-bit keys
    /// (rule `narrow-dictionary`: reading one fails once a row group holds more distinct values
    /// than its keys number).
    async fn readable_column_type(&self, name: &str, column: &str) -> std::result::Result<DataType, PolicyError> {
        let t = self.column_type(name, column).await?;
        match narrow_index(&t) {
            None => Ok(t),
            Some(index) => Err(PolicyError::Invalid(format!(
                "column '{column}' is {t}: a {index} dictionary index fails to read a row group with more \
                 distinct values than it numbers, so analyst queries may not read it (rule narrow-dictionary); \
                 rewrite the file with 32-bit dictionary indices or plain values"
            ))),
        }
    }

    /// Declares the public group keys of a private table's column: a `GROUP BY` on it then
    /// returns exactly one row per key (SPEC §7). Each value must parse as the column's type.
    pub async fn set_keys(&self, name: &str, column: &str, values: &[String]) -> std::result::Result<(), PolicyError> {
        let t = &self.readable_column_type(name, column).await?;
        // A dictionary-encoded column's keys are values of its value type.
        let t = match t {
            DataType::Dictionary(_, values) => values.as_ref(),
            t => t,
        };
        if !(t.is_integer()
            || matches!(
                t,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean | DataType::Date32
            ))
        {
            return Err(PolicyError::Invalid(format!(
                "column '{column}' is {t}: group keys can be declared for integer, string, boolean and date columns \
                 (dictionary-encoded or not)"
            )));
        }
        let mut canonical = Vec::with_capacity(values.len());
        for v in values {
            let parsed = datafusion::common::ScalarValue::try_from_string(v.clone(), t)
                .ok()
                .filter(|s| !s.is_null())
                .ok_or_else(|| {
                PolicyError::Invalid(format!("key '{v}' is not a value of {t} (column '{column}')"))
            })?;
            canonical.push(parsed.to_string());
        }
        canonical.sort();
        canonical.dedup();
        self.catalog.set_keys(name, column, &canonical)
    }

    /// Declares as keys the distinct non-NULL values of a public table's column.
    pub async fn set_keys_from(
        &self,
        name: &str,
        column: &str,
        source_table: &str,
        source_column: &str,
    ) -> std::result::Result<usize, PolicyError> {
        let src = self
            .catalog
            .table(source_table)?
            .ok_or_else(|| PolicyError::Invalid(format!("no table named '{source_table}' in the catalog")))?;
        if src.policy.is_some() {
            return Err(PolicyError::Invalid(format!(
                "'{source_table}' is private: keys must come from a public table (the set of keys is released as is)"
            )));
        }
        let ctx = SessionContext::new();
        let provider = parquet_provider(&ctx.state(), &src.location)
            .await
            .map_err(|e| PolicyError::Invalid(format!("cannot read {}: {e}", src.location)))?;
        ctx.register_table("src", provider).map_err(|e| PolicyError::Invalid(e.to_string()))?;
        let col = source_column.replace('"', "\"\"");
        let batches = ctx
            .sql(&format!("SELECT DISTINCT CAST(\"{col}\" AS VARCHAR) FROM src WHERE \"{col}\" IS NOT NULL"))
            .await
            .map_err(|e| PolicyError::Invalid(format!("'{source_table}'.{source_column}: {e}")))?
            .collect()
            .await
            .map_err(|e| PolicyError::Invalid(e.to_string()))?;
        let mut values = Vec::new();
        for b in &batches {
            let a = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8)
                .map_err(|e| PolicyError::Invalid(e.to_string()))?;
            let a = a.as_any().downcast_ref::<datafusion::arrow::array::StringArray>().expect("cast to Utf8");
            values.extend(a.iter().flatten().map(str::to_string));
        }
        self.set_keys(name, column, &values).await?;
        Ok(values.len())
    }

    /// Sets the public curve length of a private table's list columns.
    pub fn set_curve_length(&self, name: &str, length: i64) -> std::result::Result<(), PolicyError> {
        self.catalog.set_curve_length(name, length)
    }

    /// Declares the most rows a private table's files hold together: the public bound queries
    /// that bound privacy units or select groups plan their memory from ([The data
    /// owner](../docs/data-owner.md)). Without one (None withdraws it) they plan for an input of
    /// unknown size.
    pub fn set_row_bound(&self, name: &str, rows: Option<i64>) -> std::result::Result<(), PolicyError> {
        self.catalog.set_row_bound(name, rows)
    }

    /// Adds an analyst; returns their bearer token (shown once; the catalog keeps a salted hash).
    pub fn add_analyst(&self, name: &str) -> std::result::Result<String, PolicyError> {
        self.catalog.add_analyst(name)
    }

    /// Removes an analyst (their token stops working; their log entries stay).
    pub fn remove_analyst(&self, name: &str) -> std::result::Result<(), PolicyError> {
        self.catalog.remove_analyst(name)
    }

    /// Gives an analyst a new token and invalidates the old one.
    pub fn rotate_token(&self, name: &str) -> std::result::Result<String, PolicyError> {
        self.catalog.rotate_token(name)
    }

    /// Sets an analyst's share (ε, δ) of a private table's budget.
    pub fn grant(&self, name: &str, table: &str, epsilon: f64, delta: f64) -> std::result::Result<(), PolicyError> {
        let total = Budget::total(epsilon, delta).map_err(|e| PolicyError::Invalid(e.to_string()))?;
        self.catalog.grant(name, table, total)
    }

    /// The analysts and their shares.
    pub fn analysts(&self) -> std::result::Result<Vec<crate::policy::AnalystInfo>, PolicyError> {
        self.catalog.analysts()
    }

    /// All tables and their policies.
    pub fn tables(&self) -> std::result::Result<Vec<TableInfo>, PolicyError> {
        self.catalog.tables()
    }

    /// The release log, optionally of one table.
    pub fn release_log(&self, table: Option<&str>) -> std::result::Result<Vec<ReleaseRecord>, PolicyError> {
        self.catalog.release_log(table)
    }

    /// The stored releases, optionally of one table.
    pub fn stored_releases(&self, table: Option<&str>) -> std::result::Result<Vec<StoredReleaseRecord>, PolicyError> {
        self.catalog.stored_releases(table)
    }
}

/// `statement_sha256(sql)`: the SHA-256 under which the ledger records a statement (see
/// [`crate::statements::statement_sha256`]) — what a client matches against
/// `dpcurve.releases` and `dpcurve.results` to find its own earlier executions. Text in, text
/// out: it reads no table.
fn statement_sha256_udf() -> datafusion::logical_expr::ScalarUDF {
    use datafusion::arrow::array::{Array, AsArray, StringArray};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
    let hash = |v: Option<&str>| v.map(crate::statements::statement_sha256).transpose();
    create_udf(
        "statement_sha256",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| match &args[0] {
            ColumnarValue::Scalar(s) => {
                let text = match s {
                    datafusion::common::ScalarValue::Utf8(v) => v.as_deref(),
                    _ => None,
                };
                Ok(ColumnarValue::Scalar(datafusion::common::ScalarValue::Utf8(hash(text)?)))
            }
            ColumnarValue::Array(a) => {
                let a = a.as_string::<i32>();
                let out =
                    (0..a.len()).map(|i| hash(a.is_valid(i).then(|| a.value(i)))).collect::<Result<StringArray>>()?;
                Ok(ColumnarValue::Array(Arc::new(out)))
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_sessions_never_skip_partial_aggregation() {
        let ratio =
            |e: &Engine| e.ctx.state().config().options().execution.skip_partial_aggregation_probe_ratio_threshold;
        // Negative control: a session without a catalog keeps DataFusion's default, which skips.
        let plain = Engine::new(&SessionOptions::default(), None, None).unwrap();
        assert!(ratio(&plain) < 1.0);
        let path = crate::policy::catalog::fresh_test_path("no-skip");
        let catalog = Arc::new(Catalog::create_or_open(&path).unwrap());
        let analyst = Engine::new(&SessionOptions::default(), Some(catalog), None).unwrap();
        // A ratio of distinct groups to rows never exceeds 1: the probe never fires.
        assert!(ratio(&analyst) >= 1.0);
    }
}
