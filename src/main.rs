//! The `dpcurve` binary; see `dpcurve help`.

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(dpcurve::cli::main(args).await);
}
