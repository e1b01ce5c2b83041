//! Cluster mode on Ballista: the rows are read and the exact partial statistics
//! computed on a cluster's executors; the release — the only step that draws noise — runs on
//! the client, under its budget gate.
//!
//! # Trust model
//! Executors and the scheduler are the data owner's machines: they read the private Parquet
//! files (as the client would) and see the exact partial statistics. What they never do is
//! touch the noise: they run only the *partial* phase of each private aggregate (accumulator
//! `update`/`state`), whose output is the exact fixed-point sufficient statistic; the merge of
//! those states, the release permit and the draw from the OS CSPRNG happen in the client's
//! final aggregate, after the client's gate has debited the ledger. A private function decoded
//! on an executor has no release permit ([`Permits::Denied`]): even a plan that asked an
//! executor to evaluate one would be refused before any noise is drawn. The guard, pricing,
//! permits and the ledger (the only writer of the catalog) stay on the client; executors never
//! open the catalog. Analysts must not reach the scheduler's port: Ballista has no
//! authentication, and anyone who can submit plans to it can read the files.
//!
//! # How a query is split
//! The client plans the query exactly as in a single process (guard, pricing, permits,
//! contribution bounding, partition selection), then [`distribute`] replaces every partial
//! aggregate that reads files — `AggregateExec(Partial)` and everything below it: scans,
//! filters, the privacy-unit windows (a hash shuffle by unit, so a unit's rows meet on one
//! executor whatever the file layout) — with a [`ClusterExec`] leaf that submits that subtree
//! to the scheduler when it is first polled (after the debit), and streams back the partial
//! states. Fixed-point states merge by integer addition, so the client's final aggregate
//! computes bit for bit the statistic a single process computes, under any partitioning.
//!
//! dpcurve's functions travel with [`DpCodec`]: a private aggregate as its name and the
//! contribution bound the guard chose, the privacy-unit sampling order with its per-query key,
//! a partition selection's membership filter with the keys selected (by the client's gate,
//! before the subtree is submitted), and the total integer division.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use ballista_core::config::BallistaConfig;
use ballista_core::execution_plans::execute_physical_plan;
use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionConfig;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties, SendableRecordBatchStream,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::{StreamExt, TryStreamExt};

use crate::functions::{CallContext, Permits, context_of, with_context};
use crate::guard::cluster_udfs;
use crate::guard::unit_bound::UnitBound;
use crate::mechanism::{Contribution, NoiseSource};

/// Where a session's partial aggregation runs: a Ballista scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// `http://HOST:PORT`, as Ballista's client connects.
    scheduler_url: String,
    /// What the user gave (`df://HOST:PORT[?job_timeout=SECS]`).
    display: String,
    /// How long a job may take on the cluster, submission to last partial state.
    job_timeout: std::time::Duration,
}

/// Default of `job_timeout`: an hour.
const DEFAULT_JOB_TIMEOUT_SECS: u64 = 3600;

impl Cluster {
    /// Parses `df://HOST:PORT` (the form Ballista's clients use), optionally followed by
    /// `?job_timeout=SECS`: a job that has not finished after SECS seconds (default 3600) fails
    /// the query. Ballista waits for executors to come back when all are lost; the timeout is
    /// what ends such a query.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let form = || format!("a cluster is given as df://HOST:PORT[?job_timeout=SECS], got '{url}'");
        let rest = url.strip_prefix("df://").ok_or_else(form)?;
        let (address, params) = match rest.split_once('?') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        let (host, port) = address.rsplit_once(':').ok_or_else(form)?;
        if host.is_empty() || port.parse::<u16>().is_err() || address.contains('/') {
            return Err(form());
        }
        let mut job_timeout = DEFAULT_JOB_TIMEOUT_SECS;
        for param in params.into_iter().flat_map(|p| p.split('&')) {
            match param.split_once('=') {
                Some(("job_timeout", v)) => {
                    job_timeout = v.parse::<u64>().ok().filter(|&s| s >= 1).ok_or_else(|| {
                        format!("job_timeout is a whole number of seconds, at least 1, got '{v}' in '{url}'")
                    })?
                }
                _ => return Err(format!("unknown cluster parameter '{param}' in '{url}' (known: job_timeout)")),
            }
        }
        Ok(Self {
            scheduler_url: format!("http://{host}:{port}"),
            display: url.to_string(),
            job_timeout: std::time::Duration::from_secs(job_timeout),
        })
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl Cluster {
    /// Whether the scheduler accepts connections (within 5 s). Checked while planning, before
    /// the gate debits anything: an analyst whose cluster is down is told so for free. (A
    /// cluster lost after the debit fails the query with the withheld error, and the budget
    /// stays spent: the executors may have read private rows by then.)
    pub async fn check_reachable(&self) -> Result<()> {
        let addr = self.scheduler_url.trim_start_matches("http://").to_string();
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(std::time::Duration::from_secs(5), connect).await {
            Ok(Ok(_)) => Ok(()),
            _ => plan_err!(
                "the cluster {} is unreachable (its scheduler does not accept connections); nothing was charged",
                self.display
            ),
        }
    }
}

/// Whether a plan sends work to a cluster.
pub fn uses_cluster(plan: &Arc<dyn ExecutionPlan>) -> bool {
    contains(plan, "ClusterExec")
}

/// Whether the subtree reads any file (a scan of a table).
fn reads_files(plan: &Arc<dyn ExecutionPlan>) -> bool {
    contains(plan, "DataSourceExec")
}

/// Whether a node named `name` is in the subtree.
fn contains(plan: &Arc<dyn ExecutionPlan>, name: &str) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        found = node.name() == name;
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// Sends the partial phase of every aggregate that reads files to `cluster`: an
/// `AggregateExec(Partial)` becomes a [`ClusterExec`] of itself; a single-phase aggregate
/// (DataFusion combines the phases when nothing lies between them) is split into a partial
/// phase on the cluster and a final phase here. The final phases — merge and release — stay on
/// the client.
pub fn distribute(plan: Arc<dyn ExecutionPlan>, cluster: &Cluster) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if !reads_files(agg.input()) {
            return Ok(Transformed::no(node));
        }
        let replaced: Arc<dyn ExecutionPlan> = match agg.mode() {
            AggregateMode::Partial => Arc::new(ClusterExec::new(Arc::clone(&node), cluster.clone())),
            AggregateMode::Single | AggregateMode::SinglePartitioned => {
                let partial = Arc::new(AggregateExec::try_new(
                    AggregateMode::Partial,
                    agg.group_expr().clone(),
                    agg.aggr_expr().to_vec(),
                    agg.filter_expr().to_vec(),
                    Arc::clone(agg.input()),
                    agg.input_schema(),
                )?);
                let remote: Arc<dyn ExecutionPlan> = Arc::new(ClusterExec::new(partial, cluster.clone()));
                let input_schema = remote.schema();
                Arc::new(AggregateExec::try_new(
                    AggregateMode::Final,
                    agg.group_expr().as_final(),
                    agg.aggr_expr().to_vec(),
                    agg.filter_expr().to_vec(),
                    remote,
                    input_schema,
                )?)
            }
            // A final phase: its partial phase is further down.
            _ => return Ok(Transformed::no(node)),
        };
        Ok(Transformed::new(replaced, true, TreeNodeRecursion::Jump))
    })
    .map(|t| t.data)
}

/// A partial aggregate run on the cluster: a leaf that, when first polled, submits its
/// subtree to the scheduler and streams the partial states back (one partition).
#[derive(Debug)]
pub struct ClusterExec {
    remote: Arc<dyn ExecutionPlan>,
    cluster: Cluster,
    properties: Arc<PlanProperties>,
}

impl ClusterExec {
    fn new(remote: Arc<dyn ExecutionPlan>, cluster: Cluster) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(remote.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self { remote, cluster, properties }
    }
}

impl DisplayAs for ClusterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterExec: {}", self.cluster)
    }
}

impl ExecutionPlan for ClusterExec {
    fn name(&self) -> &str {
        "ClusterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { plan_err!("ClusterExec has no children") }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return datafusion::common::internal_err!("ClusterExec has one partition, asked for {partition}");
        }
        let remote = Arc::clone(&self.remote);
        let url = self.cluster.scheduler_url.clone();
        let partitions = context.session_config().target_partitions();
        let schema = remote.schema();
        let deadline = tokio::time::Instant::now() + self.cluster.job_timeout;
        let timeout = self.cluster.job_timeout.as_secs();
        // The job is submitted on the first poll: below the gate, that is after the debit.
        let submit = async move {
            let config = SessionConfig::new_with_ballista().with_target_partitions(partitions);
            let session_id = format!("dpcurve-{}", uuid_like());
            execute_physical_plan::<PhysicalPlanNode>(
                url,
                &BallistaConfig::default(),
                remote,
                &DpCodec::default(),
                session_id,
                config,
            )
            .await
        };
        let results = futures::stream::once(submit).try_flatten().boxed();
        // Every batch must arrive before the deadline; past it the query fails (and, below the
        // gate, the analyst sees the withheld error: the budget was spent).
        let bounded = futures::stream::unfold(Some(results), move |state| async move {
            let mut results = state?;
            match tokio::time::timeout_at(deadline, results.next()).await {
                Ok(Some(item)) => Some((item, Some(results))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(DataFusionError::Execution(format!("the cluster did not finish the job within {timeout} s"))),
                    None,
                )),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, bounded)))
    }
}

/// A session id for the scheduler (not secret: it names the job there).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Ballista's plan nodes, plus dpcurve's functions with what each instance carries.
#[derive(Debug, Default)]
pub struct DpCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

/// Payload tags: the first byte of an encoded dpcurve function.
const TAG_PRIVATE: u8 = 1;
const TAG_UNIT_BOUND: u8 = 2;

impl PhysicalExtensionCodec for DpCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.ballista.try_decode(buf, inputs, ctx, proto_converter)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        self.ballista.try_encode(node, buf, proto_converter)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(bytes) = cluster_udfs::encode(node) {
            buf.extend_from_slice(&bytes);
        }
        Ok(())
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        cluster_udfs::decode(name, buf).map(Arc::new)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(bound) = node.inner().downcast_ref::<UnitBound>() {
            let (groups, rows) = bound.bound();
            buf.push(TAG_UNIT_BOUND);
            buf.extend_from_slice(&groups.to_le_bytes());
            buf.extend_from_slice(&rows.to_le_bytes());
            return Ok(());
        }
        if let Some(cx) = context_of(node) {
            buf.push(TAG_PRIVATE);
            buf.extend_from_slice(&cx.contribution.rows.to_le_bytes());
            buf.extend_from_slice(&cx.contribution.groups.to_le_bytes());
        }
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        let bad = || DataFusionError::Internal(format!("cannot decode the aggregate function '{name}'"));
        if buf.len() != 17 || ![TAG_PRIVATE, TAG_UNIT_BOUND].contains(&buf[0]) {
            return Err(bad());
        }
        let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        if buf[0] == TAG_UNIT_BOUND {
            let bound = AggregateUDF::from(UnitBound::new(word(1), word(9)));
            return if bound.name() == name { Ok(Arc::new(bound)) } else { Err(bad()) };
        }
        let contribution = Contribution::new(word(1), word(9)).map_err(|_| bad())?;
        let registered = crate::functions::private_udafs(NoiseSource::Os, Permits::Denied);
        let func = registered.iter().find(|f| f.name() == name).ok_or_else(bad)?;
        // An executor computes partial states only: it can never release (no permit).
        let cx = CallContext { noise: NoiseSource::Os, permits: Permits::Denied, contribution };
        with_context(func, cx).map(Arc::new).ok_or_else(bad)
    }
}

/// Ballista's log lines on stderr, at `level` and above (`DPCURVE_LOG=info|warn|debug`;
/// default warn).
pub fn init_logging() {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() <= log::max_level()
        }
        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) {
                eprintln!("[{} {}] {}", r.level(), r.target(), r.args());
            }
        }
        fn flush(&self) {}
    }
    static LOGGER: Stderr = Stderr;
    let level = match std::env::var("DPCURVE_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("info") => log::LevelFilter::Info,
        Ok("error") => log::LevelFilter::Error,
        Ok("off") => log::LevelFilter::Off,
        _ => log::LevelFilter::Warn,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

/// Options of `dpcurve executor`.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler, `HOST:PORT`.
    pub scheduler: (String, u16),
    /// Host to bind (and advertise).
    pub bind_host: String,
    /// Arrow Flight port (partial states are fetched from it).
    pub port: u16,
    /// gRPC port.
    pub grpc_port: u16,
    /// Tasks run at once (default: cores).
    pub concurrent_tasks: Option<usize>,
    /// Directory of shuffle files (default: a temporary directory).
    pub work_dir: Option<String>,
    /// Seconds between heartbeats to the scheduler.
    pub heartbeat_seconds: u64,
}

/// Runs a Ballista executor with dpcurve's codec until it is stopped (SIGTERM, Ctrl-C).
pub async fn run_executor(opts: ExecutorOptions) -> Result<()> {
    init_logging();
    let mut config = ballista_executor::executor_process::ExecutorProcessConfig {
        bind_host: opts.bind_host.clone(),
        external_host: Some(opts.bind_host.clone()),
        port: opts.port,
        grpc_port: opts.grpc_port,
        scheduler_host: opts.scheduler.0.clone(),
        scheduler_port: opts.scheduler.1,
        scheduler_connect_timeout_seconds: 30,
        work_dir: opts.work_dir.clone(),
        executor_heartbeat_interval_seconds: opts.heartbeat_seconds.max(1),
        override_physical_codec: Some(Arc::new(DpCodec::default())),
        print_thread_info: false,
        ..Default::default()
    };
    if let Some(n) = opts.concurrent_tasks {
        config.vcores = n.max(1);
    }
    ballista_executor::executor_process::start_executor_process(Arc::new(config))
        .await
        .map_err(|e| DataFusionError::Execution(format!("executor: {e}")))
}

/// Options of `dpcurve scheduler`.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Seconds without a heartbeat after which an executor is considered lost.
    pub executor_timeout_seconds: u64,
}

/// Runs a Ballista scheduler with dpcurve's codec until the process ends.
pub async fn run_scheduler(opts: SchedulerOptions) -> Result<()> {
    init_logging();
    let mut config = ballista_scheduler::config::SchedulerConfig {
        bind_host: opts.listen.ip().to_string(),
        bind_port: opts.listen.port(),
        external_host: opts.listen.ip().to_string(),
        override_physical_codec: Some(Arc::new(DpCodec::default())),
        ..Default::default()
    };
    config.executor_timeout_seconds = opts.executor_timeout_seconds.max(1);
    config.expire_dead_executor_interval_seconds = config.executor_timeout_seconds.clamp(1, 15);
    let cluster = ballista_scheduler::cluster::BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| DataFusionError::Execution(format!("scheduler: {e}")))?;
    ballista_scheduler::scheduler_process::start_server(cluster, opts.listen, Arc::new(config))
        .await
        .map_err(|e| DataFusionError::Execution(format!("scheduler: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_are_df_host_port() {
        let c = Cluster::parse("df://127.0.0.1:50050").unwrap();
        assert_eq!(c.scheduler_url, "http://127.0.0.1:50050");
        assert_eq!(c.to_string(), "df://127.0.0.1:50050");
        assert_eq!(c.job_timeout.as_secs(), 3600);
        let c = Cluster::parse("df://h:1?job_timeout=15").unwrap();
        assert_eq!((c.scheduler_url.as_str(), c.job_timeout.as_secs()), ("http://h:1", 15));
        for bad in [
            "127.0.0.1:50050",
            "df://host",
            "df://:1",
            "df://h:port",
            "df://h:1/x",
            "http://h:1",
            "df://h:1?job_timeout=0",
            "df://h:1?job_timeout=1.5",
            "df://h:1?timeout=3",
        ] {
            assert!(Cluster::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn private_aggregates_travel_with_their_contribution_and_without_permits() {
        let codec = DpCodec::default();
        let registered = crate::functions::private_udafs(NoiseSource::Os, Permits::Free);
        for func in &registered {
            let cx = CallContext {
                noise: NoiseSource::TestSeed(3),
                permits: Permits::Free,
                contribution: Contribution::new(7, 3).unwrap(),
            };
            let func = with_context(func, cx).unwrap();
            let mut buf = Vec::new();
            codec.try_encode_udaf(&func, &mut buf).unwrap();
            let back = codec.try_decode_udaf(func.name(), &buf).unwrap();
            let got = context_of(&back).unwrap();
            assert_eq!(got.contribution, Contribution::new(7, 3).unwrap());
            assert_eq!(got.permits, Permits::Denied, "an executor's copy can never release");
            assert_eq!(got.noise, NoiseSource::Os, "no test seed crosses the wire");
        }
        // Anything else is refused, not guessed.
        assert!(codec.try_decode_udaf("private_kde", &[]).is_err());
        assert!(codec.try_decode_udaf("count", &[TAG_PRIVATE; 17]).is_err());
    }
}
