//! The `dpcurve` binary; see `dpcurve help`.

#[tokio::main]
async fn main() {
    dpcurve::allocator::keep_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = args.first().map(String::as_str);
    // Like other command-line tools, end quietly when the reader of our output goes away
    // (`dpcurve … | head`): Rust ignores SIGPIPE by default, which turns the next write
    // into a panic. Restoring the default action makes the process end on that signal.
    // Not in processes that talk over sockets for a living (a server, a scheduler, an
    // executor, a cluster client): a vectored write (`writev`) to a socket whose peer left
    // raises SIGPIPE too, and that must be an error on one connection, not the process's end.
    let networked =
        matches!(command, Some("serve" | "scheduler" | "executor")) || args.iter().any(|a| a == "--cluster");
    #[cfg(unix)]
    if !networked {
        // SAFETY: setting a signal disposition to SIG_DFL before any other thread writes output.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let analysts = (args.first().map(String::as_str) == Some("sql") && args.iter().any(|a| a == "--catalog"))
        || args.first().map(String::as_str) == Some("serve");
    if analysts {
        // Analyst sessions: a panic message could quote a private value, and the gate turns
        // the panic itself into a withheld error; print nothing about it.
        std::panic::set_hook(Box::new(|_| {}));
    }
    std::process::exit(dpcurve::cli::main(args).await);
}
