//! The `dpcurve` command line: `sql` (one-shot or REPL) and `demo`.

pub mod demo;
pub mod format;
pub mod plot;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use datafusion::common::Result;

use crate::session::{DpSession, QueryOutput, SessionOptions};
use format::Format;

/// Usage text.
pub const USAGE: &str = "\
dpcurve — differentially private curves over Parquet with SQL

USAGE:
  dpcurve demo [--dir DIR]
      Writes a Parquet file of 100 000 draws from a two-normal mixture, runs
      private_kde on it, and draws the private and non-private curves in the
      terminal and in DIR/kde.svg (DIR defaults to ./dpcurve-demo).

  dpcurve sql [--table NAME=PATH]... [--format table|csv|json] [--partitions N]
              [--plot] [--svg FILE] [-c SQL | -f FILE]
      Runs SQL statements (several per string or file, separated by ';').
      Without -c or -f, starts an interactive prompt (or reads SQL from a pipe).
      --table      register a Parquet file or directory as table NAME
      --format     output format: table (default), csv, or json (one object per line)
      --plot       draw every curve in the results in the terminal
      --svg FILE   also write the curves of the last result to an SVG image

  dpcurve help     this text
";

/// Options of `dpcurve sql`.
#[derive(Debug, Default)]
struct SqlArgs {
    tables: Vec<(String, String)>,
    format: Option<Format>,
    partitions: Option<usize>,
    command: Option<String>,
    file: Option<PathBuf>,
    plot: bool,
    svg: Option<PathBuf>,
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
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
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
    fn print(&self, results: &[QueryOutput]) -> Result<()> {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for r in results {
            format::write_output(&mut out, r, self.format)?;
            if self.plot {
                for c in plot::curves(r) {
                    writeln!(out, "\n{}", c.name)?;
                    write!(out, "{}", plot::terminal(std::slice::from_ref(&c), 72, 16))?;
                }
            }
        }
        if let (Some(path), Some(last)) = (&self.svg, results.last()) {
            let curves = plot::curves(last);
            if curves.is_empty() {
                eprintln!("note: no curve in the last result, {} not written", path.display());
            } else {
                std::fs::write(path, plot::svg(&curves, "dpcurve", "x", "y"))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Ok(())
    }
}

async fn run_sql(args: SqlArgs) -> Result<()> {
    let session = DpSession::new(SessionOptions { target_partitions: args.partitions, ..Default::default() });
    for (name, path) in &args.tables {
        session.register_parquet(name, path).await?;
    }
    let printer = Printer { format: args.format.unwrap_or(Format::Table), plot: args.plot, svg: args.svg };
    if let Some(sql) = &args.command {
        return printer.print(&session.sql(sql).await?);
    }
    if let Some(file) = &args.file {
        let sql = std::fs::read_to_string(file)?;
        return printer.print(&session.sql(&sql).await?);
    }
    repl(&session, &printer).await
}

/// Reads statements ending in ';' from standard input and runs each; errors are printed
/// and the prompt continues. `\q`, `quit` or end of input leaves.
async fn repl(session: &DpSession, printer: &Printer) -> Result<()> {
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        println!("dpcurve {} — end statements with ';', \\q to quit", env!("CARGO_PKG_VERSION"));
    }
    let mut buffer = String::new();
    let mut failed = false;
    let stdin = std::io::stdin();
    loop {
        if interactive {
            print!("{}", if buffer.is_empty() { "dpcurve> " } else { "     ..> " });
            std::io::stdout().flush()?;
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
            match session.sql(&sql).await {
                Ok(results) => printer.print(&results)?,
                Err(e) => {
                    failed = true;
                    eprintln!("error: {e}");
                }
            }
        }
    }
    if !buffer.trim().is_empty() {
        match session.sql(&buffer).await {
            Ok(results) => printer.print(&results)?,
            Err(e) => {
                failed = true;
                eprintln!("error: {e}");
            }
        }
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
