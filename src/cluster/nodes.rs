//! The cluster's own processes: `dpcurve scheduler` and `dpcurve executor`, Ballista's with
//! dpcurve's codec, and their log lines.

use std::net::SocketAddr;
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};

use super::codec::DpCodec;

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
