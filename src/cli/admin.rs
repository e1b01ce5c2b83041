//! `dpcurve admin --catalog PATH …`: the data owner's commands.

use std::path::{Path, PathBuf};

use datafusion::common::{DataFusionError, Result};

use crate::mechanism::noise::budget::Budget;
use crate::session::Admin;

/// One admin command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Register a Parquet location as a public table.
    Register { name: String, location: String },
    /// Make a table private with a total budget.
    MakePrivate { name: String, epsilon: f64, delta: f64 },
    /// Read a private table's files whole again and record them.
    Verify { name: String },
    /// Add budget.
    RaiseBudget { name: String, epsilon: f64, delta: f64 },
    /// Public bounds of a column.
    SetBounds { name: String, column: String, lower: f64, upper: f64 },
    /// Public curve length.
    SetCurveLength { name: String, length: i64 },
    /// Public bound on a private table's rows (None: withdrawn).
    SetRowBound { name: String, rows: Option<i64> },
    /// Memory limit of analyst sessions.
    SetMemoryLimit { bytes: u64 },
    /// Make relative locations absolute.
    MigrateLocations { base: Option<String> },
    /// Declare public group keys.
    SetKeys { name: String, column: String, values: Vec<String> },
    /// Declare the privacy unit.
    SetPrivacyUnit { name: String, column: String, max_rows: i64, max_groups: i64 },
    /// Declare public group keys from a public table's column.
    SetKeysFrom { name: String, column: String, source: String },
    /// List tables and budgets.
    List,
    /// Show the release log.
    Log { name: Option<String> },
    /// List the stored releases.
    Releases { name: Option<String> },
    /// Add an analyst (prints the token once).
    AddAnalyst { name: String },
    /// Remove an analyst.
    RemoveAnalyst { name: String },
    /// New token for an analyst.
    RotateToken { name: String },
    /// An analyst's share of a private table.
    Grant { name: String, table: String, epsilon: f64, delta: f64 },
    /// List analysts and their shares.
    Analysts,
}

fn number(s: &str, what: &str) -> std::result::Result<f64, String> {
    s.parse().map_err(|_| format!("{what} must be a number, got '{s}'"))
}

/// Parses `--catalog PATH COMMAND ARGS…`.
pub fn parse(args: &[String]) -> std::result::Result<(PathBuf, Command), String> {
    let mut catalog = None;
    let mut rest: Vec<&str> = Vec::new();
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--catalog" | "--epsilon" | "--delta" | "--from" | "--max-rows" | "--max-groups" => {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                if a == "--catalog" {
                    catalog = Some(PathBuf::from(v));
                } else {
                    flags.push((a.clone(), v.clone()));
                }
            }
            other if other.starts_with("--") => return Err(format!("unknown option '{other}'")),
            other => rest.push(other),
        }
    }
    let catalog = catalog.ok_or("admin needs --catalog PATH")?;
    let flag = |name: &str| flags.iter().find(|(f, _)| f == name).map(|(_, v)| v.as_str());
    let budget = |need_delta: bool| -> std::result::Result<(f64, f64), String> {
        let e = number(flag("--epsilon").ok_or("--epsilon is required")?, "--epsilon")?;
        let d = match flag("--delta") {
            Some(d) => number(d, "--delta")?,
            None if need_delta => return Err("--delta is required (use --delta 0 for pure ε-DP only)".into()),
            None => 0.0,
        };
        Ok((e, d))
    };
    let cmd = match rest.as_slice() {
        ["register", name, location] => Command::Register { name: name.to_string(), location: location.to_string() },
        ["make-private", name] => {
            let (epsilon, delta) = budget(true)?;
            Command::MakePrivate { name: name.to_string(), epsilon, delta }
        }
        ["verify", name] => Command::Verify { name: name.to_string() },
        ["raise-budget", name] => {
            let (epsilon, delta) = budget(false)?;
            Command::RaiseBudget { name: name.to_string(), epsilon, delta }
        }
        ["set-bounds", name, column, lower, upper] => Command::SetBounds {
            name: name.to_string(),
            column: column.to_string(),
            lower: number(lower, "LOWER")?,
            upper: number(upper, "UPPER")?,
        },
        ["set-curve-length", name, length] => Command::SetCurveLength {
            name: name.to_string(),
            length: length.parse().map_err(|_| format!("LENGTH must be an integer, got '{length}'"))?,
        },
        ["set-row-bound", name, "none"] => Command::SetRowBound { name: name.to_string(), rows: None },
        ["set-row-bound", name, rows] => Command::SetRowBound {
            name: name.to_string(),
            rows: Some(rows.parse().map_err(|_| format!("ROWS must be an integer or 'none', got '{rows}'"))?),
        },
        ["set-memory-limit", size] => Command::SetMemoryLimit { bytes: parse_size(size)? },
        ["migrate-locations"] => Command::MigrateLocations { base: None },
        ["migrate-locations", base] => Command::MigrateLocations { base: Some(base.to_string()) },
        ["set-keys", name, column] if flag("--from").is_some() => Command::SetKeysFrom {
            name: name.to_string(),
            column: column.to_string(),
            source: flag("--from").unwrap_or_default().to_string(),
        },
        ["set-privacy-unit", name, column] => {
            let int = |f: &str, default: Option<i64>| -> std::result::Result<i64, String> {
                match (flag(f), default) {
                    (Some(v), _) => v.parse().map_err(|_| format!("{f} must be an integer, got '{v}'")),
                    (None, Some(d)) => Ok(d),
                    (None, None) => Err(format!("{f} is required")),
                }
            };
            Command::SetPrivacyUnit {
                name: name.to_string(),
                column: column.to_string(),
                max_rows: int("--max-rows", None)?,
                max_groups: int("--max-groups", Some(1))?,
            }
        }
        ["set-keys", name, column, values @ ..] => Command::SetKeys {
            name: name.to_string(),
            column: column.to_string(),
            values: values.iter().map(|v| v.to_string()).collect(),
        },
        ["add-analyst", name] => Command::AddAnalyst { name: name.to_string() },
        ["remove-analyst", name] => Command::RemoveAnalyst { name: name.to_string() },
        ["rotate-token", name] => Command::RotateToken { name: name.to_string() },
        ["grant", name, table] => {
            let (epsilon, delta) = budget(true)?;
            Command::Grant { name: name.to_string(), table: table.to_string(), epsilon, delta }
        }
        ["analysts"] => Command::Analysts,
        ["list"] => Command::List,
        ["log"] => Command::Log { name: None },
        ["log", name] => Command::Log { name: Some(name.to_string()) },
        ["releases"] => Command::Releases { name: None },
        ["releases", name] => Command::Releases { name: Some(name.to_string()) },
        [] => return Err("admin needs a command".into()),
        other => return Err(format!("unknown or incomplete admin command: {}", other.join(" "))),
    };
    Ok((catalog, cmd))
}

/// A size in bytes: a number with an optional unit (KiB, MiB, GiB, TiB; KB/MB/GB/TB are read
/// as the binary units too).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("SIZE must be a number of bytes with an optional unit (MiB, GiB), got '{text}'")),
    };
    let v: f64 = num.parse().map_err(|_| format!("SIZE must be a number with an optional unit, got '{text}'"))?;
    let bytes = v * scale as f64;
    if !(bytes.is_finite() && (1.0..1.8e19).contains(&bytes)) {
        return Err(format!("SIZE is out of range: '{text}'"));
    }
    Ok(bytes as u64)
}

fn err(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Plan(e.to_string())
}

fn budget_cols(b: &Budget) -> (String, String) {
    let s = b.to_string();
    let (e, d) = s.split_once(", ").unwrap_or((&s, ""));
    (e.trim_start_matches("ε = ").to_string(), d.trim_start_matches("δ = ").to_string())
}

/// `bytes` in the largest binary unit that keeps it ≥ 1.
pub fn human_bytes(bytes: u64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{bytes} bytes") } else { format!("{} {}", (v * 100.0).round() / 100.0, units[i]) }
}

/// Runs one admin command and prints its result.
pub async fn run(catalog: &Path, cmd: Command) -> Result<()> {
    let admin = Admin::open(catalog).map_err(err)?;
    match cmd {
        Command::Register { name, location } => {
            admin.register(&name, &location).await.map_err(err)?;
            println!("registered '{name}' ({location}) as a public table");
        }
        Command::MakePrivate { name, epsilon, delta } => {
            admin.make_private(&name, epsilon, delta).await.map_err(err)?;
            println!("'{name}' is private with a total budget of {}", Budget::total(epsilon, delta).map_err(err)?);
        }
        Command::Verify { name } => {
            let n = admin.verify(&name).await.map_err(err)?;
            println!("'{name}': {n} file(s) read whole; analysts' queries read these files, unchanged");
        }
        Command::RaiseBudget { name, epsilon, delta } => {
            let total = admin.raise_budget(&name, epsilon, delta).map_err(err)?;
            println!("'{name}' now has a total budget of {total}");
        }
        Command::SetBounds { name, column, lower, upper } => {
            admin.set_bounds(&name, &column, lower, upper).await.map_err(err)?;
            println!("'{name}'.{column} has public bounds [{lower}, {upper}]");
        }
        Command::SetCurveLength { name, length } => {
            admin.set_curve_length(&name, length).map_err(err)?;
            println!("'{name}' list columns have public length {length}");
        }
        Command::SetRowBound { name, rows } => {
            admin.set_row_bound(&name, rows).map_err(err)?;
            match rows {
                Some(rows) => println!(
                    "'{name}' holds at most {rows} rows (public): queries bounding its units or selecting its groups \
                     plan their memory from this bound, and are refused while its files hold more"
                ),
                None => println!(
                    "'{name}' declares no row bound: queries bounding its units or selecting its groups plan for \
                     rows of unknown number and spill to disk"
                ),
            }
        }
        Command::SetMemoryLimit { bytes } => {
            admin.set_memory_limit(bytes).map_err(err)?;
            println!("analyst sessions on this catalog run under a memory limit of {}", human_bytes(bytes));
        }
        Command::MigrateLocations { base } => {
            let done = admin.migrate_locations(base.as_deref().map(Path::new)).map_err(err)?;
            if done.is_empty() {
                println!("every location is already absolute");
            }
            for (name, old, new) in done {
                println!("'{name}': {old} → {new}");
            }
        }
        Command::SetKeys { name, column, values } => {
            admin.set_keys(&name, &column, &values).await.map_err(err)?;
            match values.len() {
                0 => println!("'{name}'.{column} has no declared keys"),
                n => println!("'{name}'.{column} has {n} declared public keys"),
            }
        }
        Command::SetPrivacyUnit { name, column, max_rows, max_groups } => {
            admin.set_privacy_unit(&name, &column, max_rows, max_groups).await.map_err(err)?;
            println!(
                "'{name}' protects units of '{column}': each release keeps at most {max_rows} rows per unit and \
                 group, in at most {max_groups} groups per unit, and its noise covers that bound"
            );
        }
        Command::SetKeysFrom { name, column, source } => {
            let (table, col) =
                source.split_once('.').ok_or_else(|| err(format!("--from needs TABLE.COLUMN, got '{source}'")))?;
            let n = admin.set_keys_from(&name, &column, table, col).await.map_err(err)?;
            println!("'{name}'.{column} has {n} declared public keys (the values of '{table}'.{col})");
        }
        Command::List => {
            println!("analyst sessions' memory limit: {}", human_bytes(admin.memory_limit().map_err(err)?));
            println!(
                "{:<20} {:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  bounds / location",
                "table", "access", "ε total", "ε spent", "ε left", "δ total", "δ spent", "δ left"
            );
            for t in admin.tables().map_err(err)? {
                match &t.policy {
                    None => println!("{:<20} {:<8} {:>65}  {}", t.name, "public", "", t.location),
                    Some(p) => {
                        let (et, dt) = budget_cols(&p.total);
                        let (es, ds) = budget_cols(&p.spent);
                        let (er, dr) = budget_cols(&p.remaining());
                        let mut extra: Vec<String> =
                            p.bounds.iter().map(|(c, (lo, hi))| format!("{c} ∈ [{lo}, {hi}]")).collect();
                        if let Some(m) = p.curve_length {
                            extra.push(format!("curve length {m}"));
                        }
                        if let Some(n) = p.row_bound {
                            extra.push(format!("≤ {n} rows"));
                        }
                        if let Some(u) = &p.unit {
                            extra.push(format!("unit {} (≤ {} rows, ≤ {} groups)", u.column, u.max_rows, u.max_groups));
                        }
                        for (c, keys) in &p.keys {
                            let shown: Vec<&str> = keys.iter().take(5).map(String::as_str).collect();
                            let more =
                                if keys.len() > 5 { format!(", … ({} keys)", keys.len()) } else { String::new() };
                            extra.push(format!("{c} keys {{{}{more}}}", shown.join(", ")));
                        }
                        extra.push(match (&p.verified, admin.files_changed(&t.name).await) {
                            (None, _) => "NOT VERIFIED (admin verify)".to_string(),
                            (Some(files), Ok(Some(false))) => format!("{} verified file(s)", files.len()),
                            (Some(_), Ok(_)) => "FILES CHANGED since verified (admin verify)".to_string(),
                            (Some(_), Err(e)) => format!("FILES UNREADABLE ({e})"),
                        });
                        extra.push(t.location.clone());
                        println!(
                            "{:<20} {:<8} {et:>10} {es:>10} {er:>10} {dt:>10} {ds:>10} {dr:>10}  {}",
                            t.name,
                            "private",
                            extra.join("; ")
                        );
                    }
                }
            }
        }
        Command::Log { name } => {
            for r in admin.release_log(name.as_deref()).map_err(err)? {
                let who = r.analyst.as_deref().unwrap_or("(owner)");
                println!(
                    "{:>5}  {}  {:<12} {:<16} {:<20} {}  {}",
                    r.id, r.at, who, r.table, r.function, r.cost, r.query
                );
            }
        }
        Command::AddAnalyst { name } => {
            let token = admin.add_analyst(&name).map_err(err)?;
            eprintln!(
                "added analyst '{name}'; their bearer token is below. It is shown only now (the catalog keeps a \
                 salted hash): hand it to the analyst over a private channel. Grant shares with `grant {name} TABLE \
                 --epsilon E --delta D`."
            );
            println!("{token}");
        }
        Command::RemoveAnalyst { name } => {
            admin.remove_analyst(&name).map_err(err)?;
            println!("removed analyst '{name}': their token no longer works; their releases stay in the log");
        }
        Command::RotateToken { name } => {
            let token = admin.rotate_token(&name).map_err(err)?;
            eprintln!("new token for '{name}' (the old one no longer works); it is shown only now:");
            println!("{token}");
        }
        Command::Grant { name, table, epsilon, delta } => {
            admin.grant(&name, &table, epsilon, delta).map_err(err)?;
            println!(
                "'{name}' has a share of {} of table '{table}' (charged together with the table's total)",
                Budget::total(epsilon, delta).map_err(err)?
            );
        }
        Command::Analysts => {
            println!(
                "{:<16} {:<8} {:<16} {:>10} {:>10} {:>10} {:>10}",
                "analyst", "status", "table", "ε share", "ε left", "δ share", "δ left"
            );
            for a in admin.analysts().map_err(err)? {
                let status = if a.removed_at.is_some() { "removed" } else { "active" };
                if a.grants.is_empty() {
                    println!("{:<16} {:<8} (no shares)", a.name, status);
                }
                for g in &a.grants {
                    let (et, dt) = budget_cols(&g.total);
                    let (er, dr) = budget_cols(&g.remaining());
                    println!("{:<16} {:<8} {:<16} {et:>10} {er:>10} {dt:>10} {dr:>10}", a.name, status, g.table);
                }
            }
        }
        Command::Releases { name } => {
            for r in admin.stored_releases(name.as_deref()).map_err(err)? {
                println!(
                    "{:<8} {}  {:<16} {:<20} {} (charge {})  {}",
                    r.release, r.at, r.table, r.function, r.cost, r.charge, r.parameters
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> std::result::Result<(PathBuf, Command), String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn admin_commands_parse() {
        assert_eq!(
            p("--catalog c.db make-private t --epsilon 1 --delta 1e-5").unwrap().1,
            Command::MakePrivate { name: "t".into(), epsilon: 1.0, delta: 1e-5 }
        );
        assert_eq!(
            p("raise-budget t --epsilon 0.5 --catalog c.db").unwrap().1,
            Command::RaiseBudget { name: "t".into(), epsilon: 0.5, delta: 0.0 }
        );
        assert!(p("--catalog c.db make-private t --epsilon 1").unwrap_err().contains("--delta is required"));
        assert!(p("list").unwrap_err().contains("--catalog"));
        assert!(p("--catalog c.db set-bounds t x a 1").unwrap_err().contains("LOWER must be a number"));
        assert!(p("--catalog c.db frobnicate").is_err());
        assert_eq!(
            p("--catalog c.db grant alice t --epsilon 0.5 --delta 1e-7").unwrap().1,
            Command::Grant { name: "alice".into(), table: "t".into(), epsilon: 0.5, delta: 1e-7 }
        );
        assert!(p("--catalog c.db grant alice t --epsilon 0.5").unwrap_err().contains("--delta is required"));
        assert_eq!(p("--catalog c.db add-analyst bob").unwrap().1, Command::AddAnalyst { name: "bob".into() });
        assert_eq!(p("--catalog c.db verify t").unwrap().1, Command::Verify { name: "t".into() });
        assert!(p("--catalog c.db verify").is_err());
    }
}
