//! The `dpcurve` command line: `sql` (one-shot or REPL) and `demo`.

pub mod admin;
mod canvas;
pub mod demo;
pub mod format;
pub mod heatmap;
pub mod plot;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use datafusion::common::Result;

use crate::session::{AnalystSession, DpSession, QueryOutput, SessionOptions};
use format::Format;

/// Usage text.
pub const USAGE: &str = "\
dpcurve — differentially private curves over Parquet with SQL

USAGE:
  dpcurve demo [--dir DIR]
      Writes a Parquet file of 100 000 draws from a two-normal mixture and a
      catalog that makes it private, runs private_kde on it as an analyst, and
      draws the private and non-private curves in the terminal and in
      DIR/kde.svg (DIR defaults to ./dpcurve-demo).

  dpcurve sql --catalog PATH [--format table|csv|json] [--partitions N]
              [--plot] [--svg FILE] [--cluster df://HOST:PORT] [-c SQL | -f FILE]
      Analyst session on a catalog: tables come from the catalog, private
      tables are read only through private aggregates and every release is
      charged to the table's budget. Only queries are allowed.
      SELECT * FROM dpcurve.budgets shows the remaining budgets.

  dpcurve sql [--table NAME=PATH]... [options as above]
      Free session over public Parquet files (any SQL, no budgets).

      -c / -f      run the statements in a string / file (separated by ';');
                   without either, an interactive prompt (or SQL from a pipe)
      --format     output format: table (default), csv, or json (one object per line)
      --plot       draw every curve (and 2-D density, as a heat map) in the
                   results in the terminal
      --svg FILE   also write the curves (or else the 2-D densities) of the
                   last result to an SVG image

  dpcurve serve --catalog PATH [--listen HOST:PORT] [--tls-cert F --tls-key F]
                [--max-queries-per-analyst N] [--max-bytes-per-analyst B]
                [--partitions N] [--cluster df://HOST:PORT]
      Arrow Flight SQL server for analysts (default 127.0.0.1:50051). Every
      request needs an analyst's token (admin add-analyst); releases are
      charged on the table's budget and on the analyst's share when results
      are fetched (DoGet). Each analyst may plan or run N queries at once
      (default 4) and hold B bytes of statements and kept results (default
      268435456). Stops gracefully on Ctrl-C / SIGTERM.

  dpcurve scheduler [--listen HOST:PORT] [--executor-timeout SECS]
      A Ballista scheduler for cluster mode (default 127.0.0.1:50050), with
      dpcurve's functions. Executors lost for SECS (default 180) are replaced.
      It must not be reachable by analysts (Ballista has no authentication).

  dpcurve executor --scheduler HOST:PORT [--bind-host H] [--port P]
                   [--grpc-port P] [--concurrent-tasks N] [--work-dir DIR]
                   [--heartbeat SECS]
      A Ballista executor (default ports 50052 and 50053): reads the tables'
      files — at the paths the catalog gives — and computes exact partial
      statistics; it never draws noise and never opens the catalog.

      sql/serve --cluster df://HOST:PORT[?job_timeout=SECS]   cluster mode:
      the partial phase of every aggregate over files runs on the cluster
      (one task per partition: set --partitions to the cluster's task
      slots); the guard, the ledger and every release (the noise) stay in
      the sql/serve process. A job unfinished after SECS (default 3600)
      fails the query. Needs a build with the cargo feature 'cluster'.

  dpcurve admin --catalog PATH COMMAND
      Data owner's commands (the catalog file is created if missing):
        register NAME PATH                         a Parquet file or directory, public
        make-private NAME --epsilon E --delta D    total budget of the table (reads
                                                   its files whole first: a row the
                                                   reader cannot decode is refused)
        verify NAME                                read a private table's files whole
                                                   again after changing them (until
                                                   then, queries over them are refused)
        raise-budget NAME --epsilon E [--delta D]  add to the total budget
        set-bounds NAME COLUMN LOWER UPPER         public bounds (default lo/hi)
        set-curve-length NAME LENGTH               public length of list columns
        set-keys NAME COLUMN VALUE...              public group keys of a column
        set-keys NAME COLUMN --from TABLE.COLUMN   (or the values of a public column)
        set-privacy-unit NAME COLUMN --max-rows K [--max-groups L]
                                                   the privacy unit (a person, a device)
        set-row-bound NAME ROWS|none               public bound on the table's rows, from
                                                   which unit and selection queries plan
                                                   their memory ('none' withdraws it)
        set-memory-limit SIZE                      memory limit of analyst sessions
                                                   (e.g. 4GiB; default 2 GiB)
        migrate-locations [BASE_DIR]               make relative locations (older
                                                   catalogs) absolute, resolved against
                                                   BASE_DIR (default: the catalog's dir)
        list                                       tables, budgets, bounds
        log [NAME]                                 the release log (with who spent)
        releases [NAME]                            the stored releases
        add-analyst NAME                           a new analyst; prints their bearer
                                                   token once (only a salted hash is kept)
        rotate-token NAME                          a new token (the old one stops working)
        remove-analyst NAME                        the token stops working for good
        grant NAME TABLE --epsilon E --delta D     the analyst's share of a private
                                                   table's budget (charged with the total)
        analysts                                   analysts and their shares

  dpcurve help     this text
";

/// Options of `dpcurve sql`.
#[derive(Debug, Default)]
struct SqlArgs {
    catalog: Option<PathBuf>,
    tables: Vec<(String, String)>,
    format: Option<Format>,
    partitions: Option<usize>,
    command: Option<String>,
    file: Option<PathBuf>,
    plot: bool,
    svg: Option<PathBuf>,
    cluster: Option<String>,
}

fn parse_sql_args(args: &[String]) -> std::result::Result<SqlArgs, String> {
    let mut out = SqlArgs::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "--table" | "-t" => {
                let v = value(a)?;
                let (name, path) = v.split_once('=').ok_or_else(|| format!("--table expects NAME=PATH, got '{v}'"))?;
                out.tables.push((name.to_string(), path.to_string()));
            }
            "--format" => {
                let v = value(a)?;
                out.format = Some(Format::parse(&v).ok_or_else(|| format!("unknown format '{v}' (table, csv, json)"))?);
            }
            "--partitions" => {
                let v = value(a)?;
                out.partitions = Some(v.parse().map_err(|_| format!("--partitions expects a number, got '{v}'"))?);
            }
            "--catalog" => out.catalog = Some(PathBuf::from(value(a)?)),
            "--cluster" => out.cluster = Some(value(a)?),
            "-c" | "--command" => out.command = Some(value(a)?),
            "-f" | "--file" => out.file = Some(PathBuf::from(value(a)?)),
            "--plot" => out.plot = true,
            "--svg" => out.svg = Some(PathBuf::from(value(a)?)),
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    if out.command.is_some() && out.file.is_some() {
        return Err("give either -c or -f, not both".into());
    }
    if out.catalog.is_some() && !out.tables.is_empty() {
        return Err("--table cannot be used with --catalog: tables come from the catalog".into());
    }
    Ok(out)
}

/// Entry point of the binary; returns the process exit code.
pub async fn main(args: Vec<String>) -> i32 {
    let result = match args.first().map(String::as_str) {
        Some("demo") => {
            let dir = match args.get(1..) {
                Some([flag, d]) if flag == "--dir" => PathBuf::from(d),
                Some([]) | None => PathBuf::from("dpcurve-demo"),
                _ => return usage_error("demo takes only --dir DIR"),
            };
            demo::run(&dir).await
        }
        Some("sql") => match parse_sql_args(&args[1..]) {
            Ok(a) => run_sql(a).await,
            Err(e) => return usage_error(&e),
        },
        #[cfg(feature = "server")]
        Some("serve") => match parse_serve_args(&args[1..]) {
            Ok(o) => run_serve(o).await,
            Err(e) => return usage_error(&e),
        },
        #[cfg(feature = "cluster")]
        Some("scheduler") => match parse_scheduler_args(&args[1..]) {
            Ok(o) => crate::cluster::run_scheduler(o).await,
            Err(e) => return usage_error(&e),
        },
        #[cfg(feature = "cluster")]
        Some("executor") => match parse_executor_args(&args[1..]) {
            Ok(o) => crate::cluster::run_executor(o).await,
            Err(e) => return usage_error(&e),
        },
        Some("admin") => match admin::parse(&args[1..]) {
            Ok((catalog, cmd)) => admin::run(&catalog, cmd).await,
            Err(e) => return usage_error(&e),
        },
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            return 0;
        }
        Some("--version" | "-V") => {
            println!("dpcurve {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Some(other) => return usage_error(&format!("unknown command '{other}'")),
    };
    match result {
        Ok(()) => 0,
        // The reader of our output left (`… | head`): end quietly, with the status a process
        // ended by SIGPIPE reports (networked commands ignore that signal; see main.rs).
        Err(e) if OutputClosed::is(&e) => 141,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// Standard output was closed by its reader while results were being written.
#[derive(Debug)]
struct OutputClosed;

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for OutputClosed {}

impl OutputClosed {
    /// Turns a broken pipe on standard output into `OutputClosed`.
    fn wrap(e: std::io::Error) -> datafusion::common::DataFusionError {
        Self::recognise(e.into())
    }

    /// The same for an error of the formatters (the JSON writer reports Arrow's I/O errors).
    fn recognise(e: datafusion::common::DataFusionError) -> datafusion::common::DataFusionError {
        use datafusion::arrow::error::ArrowError;
        use datafusion::common::DataFusionError;
        let broken = |io: &std::io::Error| io.kind() == std::io::ErrorKind::BrokenPipe;
        match &e {
            DataFusionError::IoError(io) if broken(io) => DataFusionError::External(Box::new(OutputClosed)),
            DataFusionError::ArrowError(a, _) if matches!(&**a, ArrowError::IoError(_, io) if broken(io)) => {
                DataFusionError::External(Box::new(OutputClosed))
            }
            _ => e,
        }
    }

    fn is(e: &datafusion::common::DataFusionError) -> bool {
        matches!(e, datafusion::common::DataFusionError::External(b) if b.is::<OutputClosed>())
    }
}

/// `HOST:PORT` as (host, port).
#[cfg(feature = "cluster")]
fn host_port(flag: &str, v: &str) -> std::result::Result<(String, u16), String> {
    match v.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() => {
            Ok((h.to_string(), p.parse().map_err(|_| format!("{flag} expects HOST:PORT, got '{v}'"))?))
        }
        _ => Err(format!("{flag} expects HOST:PORT, got '{v}'")),
    }
}

/// A positive number of seconds, tasks…
#[cfg(feature = "cluster")]
fn positive(flag: &str, v: &str) -> std::result::Result<u64, String> {
    v.parse().ok().filter(|n| *n >= 1).ok_or_else(|| format!("{flag} expects a positive integer, got '{v}'"))
}

#[cfg(feature = "cluster")]
fn parse_scheduler_args(args: &[String]) -> std::result::Result<crate::cluster::SchedulerOptions, String> {
    let mut o = crate::cluster::SchedulerOptions {
        listen: "127.0.0.1:50050".parse().expect("default address"),
        executor_timeout_seconds: 180,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--listen" => {
                o.listen = v.parse().map_err(|_| format!("--listen expects HOST:PORT with an IP address, got '{v}'"))?
            }
            "--executor-timeout" => o.executor_timeout_seconds = positive(a, v)?,
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    Ok(o)
}

#[cfg(feature = "cluster")]
fn parse_executor_args(args: &[String]) -> std::result::Result<crate::cluster::ExecutorOptions, String> {
    let mut scheduler = None;
    let mut o = crate::cluster::ExecutorOptions {
        scheduler: (String::new(), 0),
        bind_host: "127.0.0.1".into(),
        port: 50052,
        grpc_port: 50053,
        concurrent_tasks: None,
        work_dir: None,
        heartbeat_seconds: 60,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--scheduler" => scheduler = Some(host_port(a, v.strip_prefix("df://").unwrap_or(v))?),
            "--bind-host" => o.bind_host = v.clone(),
            "--port" => o.port = v.parse().map_err(|_| format!("--port expects a port number, got '{v}'"))?,
            "--grpc-port" => {
                o.grpc_port = v.parse().map_err(|_| format!("--grpc-port expects a port number, got '{v}'"))?
            }
            "--concurrent-tasks" => o.concurrent_tasks = Some(positive(a, v)? as usize),
            "--work-dir" => o.work_dir = Some(v.clone()),
            "--heartbeat" => o.heartbeat_seconds = positive(a, v)?,
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    o.scheduler = scheduler.ok_or("executor needs --scheduler HOST:PORT")?;
    Ok(o)
}

#[cfg(feature = "server")]
fn parse_serve_args(args: &[String]) -> std::result::Result<crate::server::ServeOptions, String> {
    let mut catalog = None;
    let mut listen: std::net::SocketAddr = "127.0.0.1:50051".parse().expect("default address");
    let (mut cert, mut key) = (None, None);
    let mut max = crate::server::DEFAULT_MAX_QUERIES_PER_ANALYST;
    let mut bytes = crate::server::DEFAULT_MAX_BYTES_PER_ANALYST;
    let mut partitions = None;
    let mut cluster = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--catalog" => catalog = Some(PathBuf::from(v)),
            "--listen" => {
                listen = v.parse().map_err(|_| format!("--listen expects HOST:PORT with an IP address, got '{v}'"))?
            }
            "--tls-cert" => cert = Some(PathBuf::from(v)),
            "--tls-key" => key = Some(PathBuf::from(v)),
            "--max-queries-per-analyst" => {
                max = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("--max-queries-per-analyst expects a positive integer, got '{v}'"))?
            }
            "--max-bytes-per-analyst" => {
                bytes = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("--max-bytes-per-analyst expects a positive integer, got '{v}'"))?
            }
            "--partitions" => {
                partitions = Some(v.parse().map_err(|_| format!("--partitions expects a number, got '{v}'"))?)
            }
            "--cluster" => cluster = Some(v.clone()),
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    let tls = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err("TLS needs both --tls-cert and --tls-key".into()),
    };
    let mut o = crate::server::ServeOptions::new(catalog.ok_or("serve needs --catalog PATH")?, listen);
    o.tls = tls;
    o.max_queries_per_analyst = max;
    o.max_bytes_per_analyst = bytes;
    o.target_partitions = partitions;
    o.cluster = cluster;
    Ok(o)
}

#[cfg(feature = "server")]
async fn run_serve(opts: crate::server::ServeOptions) -> Result<()> {
    let scheme = if opts.tls.is_some() { "grpc+tls" } else { "grpc" };
    let catalog = opts.catalog.display().to_string();
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        // (Not eprintln!/println!: they panic when the stream is closed, and a server whose
        // output nobody reads must serve on.)
        let _ = writeln!(std::io::stderr(), "dpcurve: shutting down (finishing the queries in flight)");
    };
    crate::server::serve(opts, shutdown, |addr| {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "dpcurve: serving Flight SQL on {scheme}://{addr} (catalog {catalog})");
        let _ = out.flush();
    })
    .await
    .map_err(datafusion::common::DataFusionError::Plan)
}

fn usage_error(msg: &str) -> i32 {
    eprintln!("error: {msg}\n\n{USAGE}");
    2
}

struct Printer {
    format: Format,
    plot: bool,
    svg: Option<PathBuf>,
}

impl Printer {
    /// Prints one statement's result (and its terminal plots).
    fn print_text(&self, r: &QueryOutput) -> Result<()> {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        format::write_output(&mut out, r, self.format).map_err(OutputClosed::recognise)?;
        if self.plot {
            for c in plot::curves(r) {
                writeln!(out, "\n{}", c.name).map_err(OutputClosed::wrap)?;
                write!(out, "{}", plot::terminal(std::slice::from_ref(&c), 72, 16)).map_err(OutputClosed::wrap)?;
            }
            for m in heatmap::surfaces(r) {
                writeln!(out, "\n{}", m.name).map_err(OutputClosed::wrap)?;
                write!(out, "{}", heatmap::terminal(&m, 64, 24)).map_err(OutputClosed::wrap)?;
            }
        }
        out.flush().map_err(OutputClosed::wrap)
    }

    /// Draws the last statement's curves or surface to the `--svg` file, if one was asked for.
    fn write_svg(&self, last: &QueryOutput) -> Result<()> {
        let Some(path) = &self.svg else { return Ok(()) };
        let (curves, surfaces) = (plot::curves(last), heatmap::surfaces(last));
        if !curves.is_empty() {
            std::fs::write(path, plot::svg(&curves, "dpcurve", "x", "y"))?;
            eprintln!("wrote {}", path.display());
        } else if !surfaces.is_empty() {
            std::fs::write(path, heatmap::svg(&surfaces, "x", "y"))?;
            eprintln!("wrote {}", path.display());
        } else {
            eprintln!("note: no curve or surface in the last result, {} not written", path.display());
        }
        Ok(())
    }
}

/// Either kind of SQL session.
enum AnySession {
    Free(DpSession),
    Analyst(AnalystSession),
}

impl AnySession {
    /// Runs `sql`, printing each statement's result as it completes: a later failure never
    /// hides an earlier (paid) result.
    async fn run(&self, sql: &str, printer: &Printer) -> Result<()> {
        let mut last: Option<QueryOutput> = None;
        let mut done = |r: QueryOutput| {
            printer.print_text(&r)?;
            last = Some(r);
            Ok(())
        };
        let ran = match self {
            AnySession::Free(s) => s.sql_each(sql, &mut done).await,
            AnySession::Analyst(s) => s.sql_each(sql, &mut done).await,
        };
        if let Some(r) = &last {
            printer.write_svg(r)?;
        }
        ran
    }
}

async fn run_sql(args: SqlArgs) -> Result<()> {
    let opts = SessionOptions { target_partitions: args.partitions, cluster: args.cluster, ..Default::default() };
    let session = match &args.catalog {
        Some(path) => AnySession::Analyst(AnalystSession::open(path, opts).await?),
        None => {
            let s = DpSession::new(opts);
            for (name, path) in &args.tables {
                s.register_parquet(name, path).await?;
            }
            AnySession::Free(s)
        }
    };
    let printer = Printer { format: args.format.unwrap_or(Format::Table), plot: args.plot, svg: args.svg };
    if let Some(sql) = &args.command {
        return session.run(sql, &printer).await;
    }
    if let Some(file) = &args.file {
        let sql = std::fs::read_to_string(file)?;
        return session.run(&sql, &printer).await;
    }
    repl(&session, &printer).await
}

/// Reads statements ending in ';' from standard input and runs each; errors are printed
/// and the prompt continues. `\q`, `quit` or end of input leaves.
async fn repl(session: &AnySession, printer: &Printer) -> Result<()> {
    let interactive = std::io::stdin().is_terminal();
    // (Not println!/print!: they panic when the reader of the output has gone.)
    let mut out = std::io::stdout();
    if interactive {
        writeln!(out, "dpcurve {} — end statements with ';', \\q to quit", env!("CARGO_PKG_VERSION"))
            .map_err(OutputClosed::wrap)?;
    }
    let mut buffer = String::new();
    let mut failed = false;
    let stdin = std::io::stdin();
    loop {
        if interactive {
            write!(out, "{}", if buffer.is_empty() { "dpcurve> " } else { "     ..> " })
                .and_then(|()| out.flush())
                .map_err(OutputClosed::wrap)?;
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let trimmed = line.trim();
        if buffer.is_empty() && matches!(trimmed, "\\q" | "quit" | "exit") {
            break;
        }
        buffer.push_str(&line);
        if trimmed.ends_with(';') {
            let sql = std::mem::take(&mut buffer);
            if let Err(e) = session.run(&sql, printer).await {
                if OutputClosed::is(&e) {
                    return Err(e);
                }
                failed = true;
                eprintln!("error: {e}");
            }
        }
    }
    if !buffer.trim().is_empty()
        && let Err(e) = session.run(&buffer, printer).await
    {
        if OutputClosed::is(&e) {
            return Err(e);
        }
        failed = true;
        eprintln!("error: {e}");
    }
    if failed && !interactive {
        return datafusion::common::plan_err!("some statements failed (see above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn sql_arguments_parse() {
        let a = parse_sql_args(&args("--table t=/x.parquet --format json -c select --plot --svg o.svg")).unwrap();
        assert_eq!(a.tables, vec![("t".to_string(), "/x.parquet".to_string())]);
        assert_eq!(a.format, Some(Format::Json));
        assert_eq!(a.command.as_deref(), Some("select"));
        assert!(a.plot);
        assert!(parse_sql_args(&args("--format xml")).is_err());
        assert!(parse_sql_args(&args("--table nopath")).is_err());
        assert!(parse_sql_args(&args("-c a -f b")).is_err());
    }
}
