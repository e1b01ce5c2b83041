//! Embedding dpcurve in a Rust program: register a Parquet table, release a private
//! density, and read the curve out of the Arrow result.
//!
//! ```sh
//! cargo run --example embed -- path/to/file.parquet column_name
//! ```
//! Without arguments it writes a small synthetic table first.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Float64Type;
use dpcurve::{DpSession, SessionOptions};

#[tokio::main]
async fn main() -> datafusion::common::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, column) = match args.as_slice() {
        [p, c] => (p.clone(), c.clone()),
        _ => {
            let p = std::env::temp_dir().join("dpcurve-embed-example.parquet");
            dpcurve::cli::demo::write_parquet(&p, &dpcurve::datagen::mixture(10_000, 1))?;
            (p.to_string_lossy().into_owned(), "x".to_string())
        }
    };
    let session = DpSession::new(SessionOptions::default());
    session.register_parquet("t", &path).await?;
    let sql = format!(
        "SELECT private_kde({column}, bandwidth => 0.05, epsilon => 1.0, delta => 1e-6, lo => 0, hi => 1, points => 11) AS kde FROM t"
    );
    let batches = session.query(&sql).await?;
    let kde = batches[0].column(0).as_struct();
    let xs = kde.column_by_name("x").unwrap().as_list::<i32>().value(0);
    let density = kde.column_by_name("density").unwrap().as_list::<i32>();
    if density.is_null(0) {
        println!("too little mass in [0, 1]: density is NULL");
        return Ok(());
    }
    let density = density.value(0);
    for (x, d) in xs.as_primitive::<Float64Type>().values().iter().zip(density.as_primitive::<Float64Type>().values()) {
        println!("{x:>6.2}  {d:>8.4}  {}", "#".repeat((d * 20.0).max(0.0) as usize));
    }
    Ok(())
}
